//! Lowercase hexadecimal: how ids, tokens and hashes are written as text.

/// `bytes` as lowercase hex, two digits a byte.
pub fn encode(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The bytes `s` spells (pairs of hex digits, either case); `None` when it
/// is anything else or longer than `max` characters.
pub fn decode(s: &str, max: usize) -> Option<Vec<u8>> {
    if s.len() > max || !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_round_trip_and_anything_else_is_refused() {
        assert_eq!(encode(&[0, 0xab, 0xff]), "00abff");
        assert_eq!(decode("00ABff", 64), Some(vec![0, 0xab, 0xff]));
        for bad in ["abc", "+f", "zz", "éé", "0000"] {
            assert_eq!(decode(bad, 3), None, "{bad}");
        }
    }
}
