//! The type of a pull worker's error when the worker names none: one table,
//! read top to bottom, of what its code or message says (case-insensitive).
//! So a job's error history tells a time-out from a rate limit from a crash
//! even when its workers report only a code and a message (as the OJS
//! conformance suite's workers do).

/// `(type, every one of these appears, any one of these appears)`.
const RULES: &[(&str, &[&str], &[&str])] = &[
    (
        "ConnectionTimeout",
        &["connection"],
        &["timed out", "timeout"],
    ),
    (
        "Timeout",
        &[],
        &["timed out", "timeout", "deadline exceeded"],
    ),
    (
        "RateLimitExceeded",
        &[],
        &[
            "rate limit",
            "rate-limit",
            "ratelimit",
            "too many requests",
            "429",
        ],
    ),
    ("Unavailable", &[], &["unavailable", "503"]),
];

/// The type for a worker error of `code` and `message` that names no type.
pub fn classify(code: &str, message: &str) -> &'static str {
    let text = format!("{code} {message}").to_lowercase();
    RULES
        .iter()
        .find(|(_, all, any)| {
            all.iter().all(|w| text.contains(w)) && any.iter().any(|w| text.contains(w))
        })
        .map_or("InternalServerError", |(kind, _, _)| kind)
}

#[cfg(test)]
mod tests {
    use super::classify;

    #[test]
    fn errors_are_typed_by_what_their_code_or_message_says() {
        let cases = [
            (
                "handler_error",
                "Database connection timed out",
                "ConnectionTimeout",
            ),
            (
                "handler_error",
                "upstream call timeout after 30s",
                "Timeout",
            ),
            (
                "handler_error",
                "API rate limit reached",
                "RateLimitExceeded",
            ),
            ("http_429", "slow down", "RateLimitExceeded"),
            ("handler_error", "Service Unavailable", "Unavailable"),
            (
                "handler_error",
                "Unexpected null reference",
                "InternalServerError",
            ),
            ("", "", "InternalServerError"),
        ];
        for (code, message, want) in cases {
            assert_eq!(classify(code, message), want, "{code} {message}");
        }
    }
}
