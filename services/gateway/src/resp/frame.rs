//! RESP framing for the door: commands in, replies out.
//!
//! Frames are decoded and encoded by `redis-protocol` (RESP2 requests —
//! RESP3 clients send the same arrays of bulk strings — and RESP2 or RESP3
//! replies). Before a frame is handed to the decoder, [`check`] reads only
//! its headers — type bytes and length prefixes — to enforce the door's
//! limits: a command is a flat array of bulk strings (or an inline line),
//! with at most `max_arguments`, none and not all together longer than
//! `max_bulk`. So a 100 MB length prefix is refused when its header
//! arrives, before any of it is buffered, and nesting cannot recurse.

use bytes::{Bytes, BytesMut};
use redis_protocol::resp2::types::BytesFrame as Frame2;
use redis_protocol::resp3::types::BytesFrame as Frame3;

/// The door's framing limits.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Largest bulk string, and largest command in all, bytes.
    pub max_bulk: usize,
    /// Most arguments (the verb included) in one command.
    pub max_arguments: usize,
}

/// Longest inline command line (Redis's limit too).
const MAX_INLINE: usize = 64 * 1024;
/// Longest header line (`*<count>` or `$<length>`): a sign, 19 digits, CRLF.
const MAX_HEADER: usize = 22;

/// Why a connection's input is not a command this door reads; the
/// connection is answered `-ERR Protocol error: …` and closed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// A length or count that is not a number.
    #[error("invalid {0} length")]
    InvalidLength(&'static str),
    /// A bulk string longer than allowed.
    #[error(
        "invalid bulk length: {got} bytes is more than the limit of {limit} (gateway.resp.max_bulk_bytes)"
    )]
    BulkTooLong {
        /// Declared length.
        got: u64,
        /// The limit.
        limit: usize,
    },
    /// More arguments than allowed.
    #[error(
        "invalid multibulk length: {got} arguments is more than the limit of {limit} (gateway.resp.max_arguments)"
    )]
    TooManyArguments {
        /// Declared count.
        got: u64,
        /// The limit.
        limit: usize,
    },
    /// A command's arguments together exceed the bulk limit.
    #[error(
        "command too long: its arguments exceed {limit} bytes together (gateway.resp.max_bulk_bytes)"
    )]
    CommandTooLong {
        /// The limit.
        limit: usize,
    },
    /// Something other than a bulk string inside a command.
    #[error("expected '$', got '{0}'")]
    NotBulk(char),
    /// A bulk string not ended by CRLF.
    #[error("a bulk string is not followed by CRLF")]
    MissingCrlf,
    /// An inline line longer than allowed.
    #[error("too big inline request")]
    InlineTooLong,
    /// The codec refused what the guard let through (a bug).
    #[error("{0}")]
    Codec(String),
}

/// A header line at `at`: its value and where the next byte is; `None`
/// when the line is not complete yet.
fn header(
    buf: &[u8],
    at: usize,
    what: &'static str,
) -> Result<Option<(i64, usize)>, ProtocolError> {
    let rest = &buf[at..];
    let Some(end) = rest.iter().take(MAX_HEADER + 1).position(|&b| b == b'\n') else {
        return if rest.len() > MAX_HEADER {
            Err(ProtocolError::InvalidLength(what))
        } else {
            Ok(None)
        };
    };
    if end < 2 || rest[end - 1] != b'\r' {
        return Err(ProtocolError::InvalidLength(what));
    }
    let text =
        std::str::from_utf8(&rest[1..end - 1]).map_err(|_| ProtocolError::InvalidLength(what))?;
    let n = text
        .parse::<i64>()
        .map_err(|_| ProtocolError::InvalidLength(what))?;
    Ok(Some((n, at + end + 1)))
}

/// Where the command at the start of `buf` ends, reading only its headers
/// and checking the limits; `None` while it is incomplete.
pub fn check(buf: &[u8], limits: Limits) -> Result<Option<usize>, ProtocolError> {
    let Some(&first) = buf.first() else {
        return Ok(None);
    };
    if first != b'*' {
        return Ok(
            match buf.iter().take(MAX_INLINE + 1).position(|&b| b == b'\n') {
                Some(end) => Some(end + 1),
                None if buf.len() > MAX_INLINE => return Err(ProtocolError::InlineTooLong),
                None => None,
            },
        );
    }
    let Some((count, mut at)) = header(buf, 0, "multibulk")? else {
        return Ok(None);
    };
    if count <= 0 {
        // `*0` and `*-1`: nothing to run (Redis skips them too).
        return Ok(Some(at));
    }
    if count as u64 > limits.max_arguments as u64 {
        return Err(ProtocolError::TooManyArguments {
            got: count as u64,
            limit: limits.max_arguments,
        });
    }
    let mut total: usize = 0;
    for _ in 0..count {
        let Some(&kind) = buf.get(at) else {
            return Ok(None);
        };
        if kind != b'$' {
            return Err(ProtocolError::NotBulk(kind as char));
        }
        let Some((len, next)) = header(buf, at, "bulk")? else {
            return Ok(None);
        };
        if len < 0 {
            return Err(ProtocolError::InvalidLength("bulk"));
        }
        if len as u64 > limits.max_bulk as u64 {
            return Err(ProtocolError::BulkTooLong {
                got: len as u64,
                limit: limits.max_bulk,
            });
        }
        let len = len as usize;
        total += len;
        if total > limits.max_bulk {
            return Err(ProtocolError::CommandTooLong {
                limit: limits.max_bulk,
            });
        }
        let end = next + len;
        if buf.len() < end + 2 {
            return Ok(None);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err(ProtocolError::MissingCrlf);
        }
        at = end + 2;
    }
    Ok(Some(at))
}

/// The next command in `buf` (removed from it), `None` while it is
/// incomplete. An empty command (`*0`, a blank inline line) is `Some`
/// of no arguments.
pub fn next(buf: &mut BytesMut, limits: Limits) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    let Some(end) = check(buf, limits)? else {
        return Ok(None);
    };
    if buf[0] != b'*' {
        let line = buf.split_to(end).freeze();
        return Ok(Some(
            line.split(|b| b.is_ascii_whitespace())
                .filter(|w| !w.is_empty())
                .map(|w| line.slice_ref(w))
                .collect(),
        ));
    }
    let decoded = redis_protocol::resp2::decode::decode_bytes_mut(buf)
        .map_err(|e| ProtocolError::Codec(e.to_string()))?;
    match decoded {
        Some((Frame2::Array(items), _, _)) => items
            .into_iter()
            .map(|f| match f {
                Frame2::BulkString(b) => Ok(b),
                other => Err(ProtocolError::Codec(format!(
                    "unexpected {:?} in a command",
                    other
                ))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some),
        // `*0` / `*-1`.
        Some((Frame2::Null, _, _)) => Ok(Some(Vec::new())),
        Some((other, _, _)) => Err(ProtocolError::Codec(format!("unexpected {:?}", other))),
        None => Err(ProtocolError::Codec(
            "a checked command did not decode".into(),
        )),
    }
}

/// A reply, written in the connection's protocol version.
#[derive(Debug, Clone, PartialEq)]
pub enum Reply {
    /// `+OK`, `+PONG`, `+OK job_id=…`.
    Simple(String),
    /// `-ERR …`, `-NOAUTH …`: the first word is the error's code.
    Error(String),
    /// An integer.
    Int(i64),
    /// A bulk string.
    Bulk(Bytes),
    /// Nil.
    Null,
    /// An array.
    Array(Vec<Reply>),
    /// A map in RESP3; a flat array of keys and values in RESP2, as
    /// Redis answers `HELLO` and `CONFIG GET`.
    Map(Vec<(&'static str, Reply)>),
}

impl Reply {
    /// A bulk string of text.
    pub fn text(s: impl Into<String>) -> Reply {
        Reply::Bulk(Bytes::from(s.into()))
    }

    /// An error line: CR and LF would end it early, so they become spaces.
    pub fn error(code: &str, message: &str) -> Reply {
        let clean: String = message
            .chars()
            .map(|c| if c == '\r' || c == '\n' { ' ' } else { c })
            .collect();
        Reply::Error(format!("{code} {clean}"))
    }

    fn simple_line(s: &str) -> Bytes {
        Bytes::from(s.replace(['\r', '\n'], " "))
    }

    fn resp2(self) -> Frame2 {
        match self {
            Reply::Simple(s) => Frame2::SimpleString(Self::simple_line(&s)),
            Reply::Error(s) => Frame2::Error(s.replace(['\r', '\n'], " ").into()),
            Reply::Int(i) => Frame2::Integer(i),
            Reply::Bulk(b) => Frame2::BulkString(b),
            Reply::Null => Frame2::Null,
            Reply::Array(items) => Frame2::Array(items.into_iter().map(Reply::resp2).collect()),
            Reply::Map(pairs) => Frame2::Array(
                pairs
                    .into_iter()
                    .flat_map(|(k, v)| {
                        [
                            Frame2::BulkString(Bytes::from_static(k.as_bytes())),
                            v.resp2(),
                        ]
                    })
                    .collect(),
            ),
        }
    }

    fn resp3(self) -> Frame3 {
        match self {
            Reply::Simple(s) => Frame3::SimpleString {
                data: Self::simple_line(&s),
                attributes: None,
            },
            Reply::Error(s) => Frame3::SimpleError {
                data: s.replace(['\r', '\n'], " ").into(),
                attributes: None,
            },
            Reply::Int(i) => Frame3::Number {
                data: i,
                attributes: None,
            },
            Reply::Bulk(b) => Frame3::BlobString {
                data: b,
                attributes: None,
            },
            Reply::Null => Frame3::Null,
            Reply::Array(items) => Frame3::Array {
                data: items.into_iter().map(Reply::resp3).collect(),
                attributes: None,
            },
            Reply::Map(pairs) => Frame3::Map {
                data: pairs
                    .into_iter()
                    .map(|(k, v)| {
                        let key = Frame3::BlobString {
                            data: Bytes::from_static(k.as_bytes()),
                            attributes: None,
                        };
                        (key, v.resp3())
                    })
                    .collect(),
                attributes: None,
            },
        }
    }

    /// Appends the reply to `out` in protocol version `proto` (2 or 3).
    pub fn encode(self, proto: u8, out: &mut BytesMut) {
        // Encoding a well-formed frame into a growable buffer cannot fail;
        // if the codec ever says otherwise, the client still gets an error
        // reply rather than silence.
        let written = if proto >= 3 {
            redis_protocol::resp3::encode::complete::extend_encode(out, &self.resp3(), false)
                .map(|_| ())
        } else {
            redis_protocol::resp2::encode::extend_encode(out, &self.resp2(), false).map(|_| ())
        };
        if let Err(e) = written {
            tracing::error!(error = %e, "encoding a RESP reply failed");
            out.extend_from_slice(b"-ERR internal error encoding the reply\r\n");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const LIMITS: Limits = Limits {
        max_bulk: 1024,
        max_arguments: 8,
    };

    fn command(args: &[&[u8]]) -> Vec<u8> {
        let mut out = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            out.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            out.extend_from_slice(a);
            out.extend_from_slice(b"\r\n");
        }
        out
    }

    #[test]
    fn pipelined_commands_come_out_one_by_one_and_a_partial_one_waits() {
        let mut wire = command(&[b"PING"]);
        wire.extend(command(&[b"PLAN.SUBMIT", b"{\"a\": 1}\r\n"]));
        let third = command(&[b"JOB.STATUS", b"j1"]);
        wire.extend_from_slice(&third[..7]);
        let mut buf = BytesMut::from(&wire[..]);
        assert_eq!(
            next(&mut buf, LIMITS).unwrap().unwrap(),
            vec![Bytes::from("PING")]
        );
        let submit = next(&mut buf, LIMITS).unwrap().unwrap();
        assert_eq!(
            submit[1],
            Bytes::from("{\"a\": 1}\r\n"),
            "binary-safe: CRLF inside a bulk"
        );
        assert_eq!(
            next(&mut buf, LIMITS).unwrap(),
            None,
            "partial: wait for more"
        );
        buf.extend_from_slice(&third[7..]);
        assert_eq!(
            next(&mut buf, LIMITS).unwrap().unwrap()[1],
            Bytes::from("j1")
        );
        assert!(buf.is_empty());
    }

    #[test]
    fn inline_commands_split_on_whitespace() {
        let mut buf = BytesMut::from("PING hello\r\n\r\nQUIT\n");
        assert_eq!(
            next(&mut buf, LIMITS).unwrap().unwrap(),
            vec![Bytes::from("PING"), Bytes::from("hello")]
        );
        assert_eq!(
            next(&mut buf, LIMITS).unwrap().unwrap(),
            Vec::<Bytes>::new()
        );
        assert_eq!(
            next(&mut buf, LIMITS).unwrap().unwrap(),
            vec![Bytes::from("QUIT")]
        );
    }

    #[test]
    fn oversized_lengths_are_refused_from_their_headers_alone() {
        // 100 MB declared, none of it sent: refused at once.
        let huge = b"*2\r\n$11\r\nPLAN.SUBMIT\r\n$104857600\r\n";
        assert!(matches!(
            check(huge, LIMITS),
            Err(ProtocolError::BulkTooLong {
                got: 104_857_600,
                ..
            })
        ));
        assert!(matches!(
            check(b"*1000000\r\n", LIMITS),
            Err(ProtocolError::TooManyArguments { .. })
        ));
        // Each argument fits, together they do not.
        let mut two = b"*2\r\n$1000\r\n".to_vec();
        two.extend(vec![b'x'; 1000]);
        two.extend_from_slice(b"\r\n$1000\r\n");
        assert_eq!(
            check(&two, LIMITS),
            Err(ProtocolError::CommandTooLong { limit: 1024 })
        );
    }

    #[test]
    fn malformed_frames_are_protocol_errors() {
        for (bad, want) in [
            (&b"*1\r\n:5\r\n"[..], ProtocolError::NotBulk(':')),
            (b"*1\r\n*1\r\n$1\r\nx\r\n", ProtocolError::NotBulk('*')),
            (b"*x\r\n", ProtocolError::InvalidLength("multibulk")),
            (b"*1\r\n$-1\r\n", ProtocolError::InvalidLength("bulk")),
            (b"*1\r\n$3\r\nabcde", ProtocolError::MissingCrlf),
            (
                b"*99999999999999999999999\r\n",
                ProtocolError::InvalidLength("multibulk"),
            ),
        ] {
            assert_eq!(
                check(bad, LIMITS),
                Err(want),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        assert_eq!(
            check(&vec![b'x'; MAX_INLINE + 1], LIMITS),
            Err(ProtocolError::InlineTooLong)
        );
    }

    #[test]
    fn replies_encode_as_resp2_and_resp3() {
        let reply = Reply::Map(vec![("state", Reply::text("active")), ("n", Reply::Int(2))]);
        let mut two = BytesMut::new();
        reply.clone().encode(2, &mut two);
        assert_eq!(
            &two[..],
            b"*4\r\n$5\r\nstate\r\n$6\r\nactive\r\n$1\r\nn\r\n:2\r\n"
        );
        let mut three = BytesMut::new();
        reply.encode(3, &mut three);
        assert!(three.starts_with(b"%2\r\n"), "{three:?}");
        let mut err = BytesMut::new();
        Reply::error("ERR", "two\r\nlines").encode(2, &mut err);
        assert_eq!(&err[..], b"-ERR two  lines\r\n");
        let mut ok = BytesMut::new();
        Reply::Simple("OK job_id=j1".into()).encode(2, &mut ok);
        assert_eq!(&ok[..], b"+OK job_id=j1\r\n");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// Any bytes: no panic, and nothing past the limits is waited for.
        #[test]
        fn random_bytes_never_panic_and_never_wait_past_the_limits(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut buf = BytesMut::from(&bytes[..]);
            for _ in 0..64 {
                match next(&mut buf, LIMITS) {
                    Ok(Some(args)) => {
                        prop_assert!(args.len() <= LIMITS.max_arguments.max(MAX_INLINE));
                        prop_assert!(args.iter().map(Bytes::len).sum::<usize>() <= LIMITS.max_bulk.max(MAX_INLINE));
                    }
                    Ok(None) | Err(_) => break,
                }
            }
        }

        /// Valid commands cut anywhere: incomplete until whole, then the
        /// same arguments; never an error, never a panic.
        #[test]
        fn truncated_commands_wait_and_then_decode_whole(
            args in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..64), 1..6),
            cut in any::<proptest::sample::Index>(),
        ) {
            let refs: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            let wire = command(&refs);
            let at = cut.index(wire.len());
            let mut buf = BytesMut::from(&wire[..at]);
            prop_assert_eq!(next(&mut buf, LIMITS).unwrap(), None);
            buf.extend_from_slice(&wire[at..]);
            let got = next(&mut buf, LIMITS).unwrap().unwrap();
            prop_assert_eq!(got.iter().map(|b| b.to_vec()).collect::<Vec<_>>(), args);
        }

        /// Random headers with random lengths: a refusal comes from the
        /// header, before the payload is needed.
        #[test]
        fn declared_lengths_past_the_limit_are_refused_before_the_payload(len in 1025u64..u64::MAX / 2) {
            let wire = format!("*2\r\n$4\r\nPING\r\n${len}\r\n");
            let refused = matches!(check(wire.as_bytes(), LIMITS), Err(ProtocolError::BulkTooLong { .. } | ProtocolError::InvalidLength(_)));
            prop_assert!(refused);
        }
    }
}
