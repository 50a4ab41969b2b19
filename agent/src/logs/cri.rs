//! The CRI log file format, one record per line:
//! `<RFC3339Nano timestamp> <stdout|stderr> <tag> <message>\n`, where the
//! first `:`-separated field of the tag is `F` (the message ends a line) or
//! `P` (a partial: the runtime split a long line, the rest follows in the
//! next records). See the CRI's "container log format" and the kubelet's
//! `parseCRILog`.

use jiff::Timestamp;

/// Why a record could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParseError {
    /// No space-separated timestamp, or not RFC 3339.
    #[error("log record has no valid timestamp")]
    Timestamp,
    /// The stream field is missing or neither stdout nor stderr.
    #[error("log record has no valid stream type")]
    Stream,
    /// The tag field is missing.
    #[error("log record has no tag")]
    Tag,
}

/// Which output of the container a record came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// One parsed record, borrowing its message from the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Record<'a> {
    pub time: Timestamp,
    pub stream: Stream,
    /// The message continues in the next record.
    pub partial: bool,
    /// The message; a full record keeps its line's `\n`, a partial one
    /// has none, so concatenating messages restores the output.
    pub message: &'a [u8],
}

/// Parse one line of a CRI log file (with or without its `\n`).
///
/// # Errors
/// [`ParseError`] names the first field that is missing or invalid.
pub fn parse(line: &[u8]) -> Result<Record<'_>, ParseError> {
    let (time, rest) = split_field(line).ok_or(ParseError::Timestamp)?;
    let time: Timestamp = std::str::from_utf8(time)
        .ok()
        .and_then(|t| t.parse().ok())
        .ok_or(ParseError::Timestamp)?;
    let (stream, rest) = split_field(rest).ok_or(ParseError::Stream)?;
    let stream = match stream {
        b"stdout" => Stream::Stdout,
        b"stderr" => Stream::Stderr,
        _ => return Err(ParseError::Stream),
    };
    let (tag, mut message) = split_field(rest).ok_or(ParseError::Tag)?;
    // Tags are `:`-separated for forward compatibility; the first is F/P.
    let partial = tag.split(|b| *b == b':').next() == Some(b"P");
    if partial {
        message = message.strip_suffix(b"\n").unwrap_or(message);
    }
    Ok(Record {
        time,
        stream,
        partial,
        message,
    })
}

/// Whether a line is a full (`F`) record, without parsing its timestamp:
/// what tail counting needs.
pub fn is_full(line: &[u8]) -> bool {
    let mut fields = line.splitn(4, |b| *b == b' ');
    let tag = fields.nth(2);
    fields.next().is_some() && tag.is_some_and(|t| t.split(|b| *b == b':').next() != Some(b"P"))
}

/// The field before the first space, and what follows that space.
fn split_field(s: &[u8]) -> Option<(&[u8], &[u8])> {
    let i = s.iter().position(|b| *b == b' ')?;
    Some((&s[..i], &s[i + 1..]))
}

/// A CRI timestamp as the kubelet prints it with `timestamps=true`:
/// RFC 3339 with exactly nine fractional digits.
pub fn format_time(t: Timestamp) -> String {
    format!("{t:.9}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_and_partial_records() {
        let r = parse(b"2026-11-30T06:00:00.123456789Z stdout F hello world\n").unwrap();
        assert_eq!(r.stream, Stream::Stdout);
        assert!(!r.partial);
        assert_eq!(r.message, b"hello world\n");
        assert_eq!(r.time.as_nanosecond() % 1_000_000_000, 123_456_789);

        let r = parse(b"2026-11-30T06:00:00Z stderr P part one\n").unwrap();
        assert_eq!(r.stream, Stream::Stderr);
        assert!(r.partial);
        assert_eq!(r.message, b"part one");

        // Extra tags after the first are ignored; offsets are honoured.
        let r = parse(b"2026-11-30T07:00:00.5+01:00 stdout F:x y\n").unwrap();
        assert_eq!(r.time, "2026-11-30T06:00:00.5Z".parse().unwrap());
        assert_eq!(r.message, b"y\n");

        // An empty message is a line of its own.
        assert_eq!(
            parse(b"2026-11-30T06:00:00Z stdout F \n").unwrap().message,
            b"\n"
        );
        // The unterminated last line of a file.
        assert_eq!(
            parse(b"2026-11-30T06:00:00Z stdout F x").unwrap().message,
            b"x"
        );
    }

    #[test]
    fn malformed_records() {
        assert_eq!(parse(b"nonsense"), Err(ParseError::Timestamp));
        assert_eq!(parse(b"yesterday stdout F x\n"), Err(ParseError::Timestamp));
        assert_eq!(
            parse(b"2026-11-30T06:00:00Z stdin F x\n"),
            Err(ParseError::Stream)
        );
        assert_eq!(
            parse(b"2026-11-30T06:00:00Z stdout F\n"),
            Err(ParseError::Tag)
        );
    }

    #[test]
    fn fullness_without_parsing() {
        assert!(is_full(b"t stdout F x\n"));
        assert!(is_full(b"t stdout F:y x\n"));
        assert!(!is_full(b"t stdout P x\n"));
        assert!(!is_full(b"t stdout\n"));
    }

    #[test]
    fn timestamps_print_with_nine_digits() {
        let t: Timestamp = "2026-11-30T06:00:00.5Z".parse().unwrap();
        assert_eq!(format_time(t), "2026-11-30T06:00:00.500000000Z");
    }
}
