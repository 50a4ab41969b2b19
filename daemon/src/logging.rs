//! The daemons' log output on stderr, in the form its reader wants.
//!
//! - stderr is the journal (systemd sets `JOURNAL_STREAM=<dev>:<inode>` to
//!   the stream it connected, as `sd_journal_stream_fd(3)` describes):
//!   each line starts with the `<N>` syslog priority journald parses
//!   (`SyslogLevelPrefix=yes`, the default) and carries no timestamp
//!   (journald stamps every entry) and no colour codes.
//! - a terminal: tracing's usual format, in colour.
//! - anything else (a file, a pipe): the usual format without colours.
//!
//! `RUST_LOG` filters as usual; the daemon's default applies without it.

use std::fmt;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// Where stderr goes, as far as formatting is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    Journal,
    Terminal,
    Plain,
}

/// Decide the sink of stderr.
pub fn stderr_sink() -> Sink {
    use std::io::IsTerminal;
    if stderr_is_journal() {
        Sink::Journal
    } else if std::io::stderr().is_terminal() {
        Sink::Terminal
    } else {
        Sink::Plain
    }
}

/// Whether fd 2 is the stream `JOURNAL_STREAM` names: the variable alone
/// is inherited by children whose stderr went elsewhere.
fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some((dev, ino)) = std::env::var("JOURNAL_STREAM")
        .ok()
        .and_then(|v| parse_journal_stream(&v))
    else {
        return false;
    };
    // The /proc link resolves to the open file itself (socket or file).
    std::fs::metadata("/proc/self/fd/2").is_ok_and(|m| m.dev() == dev && m.ino() == ino)
}

fn parse_journal_stream(v: &str) -> Option<(u64, u64)> {
    let (dev, ino) = v.trim().split_once(':')?;
    Some((dev.parse().ok()?, ino.parse().ok()?))
}

/// Install the global subscriber on stderr; `default_filter` applies when
/// `RUST_LOG` is unset or invalid.
///
/// # Caveats
/// Call once, early; a second call is ignored.
pub fn init(default_filter: &str) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match stderr_sink() {
        Sink::Journal => builder
            .with_ansi(false)
            .event_format(JournalFormat)
            .try_init(),
        Sink::Terminal => builder.with_ansi(true).try_init(),
        Sink::Plain => builder.with_ansi(false).try_init(),
    };
}

/// `sd-daemon(3)` priority of a level: err, warning, info, debug.
pub fn priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// One journal line: `<N>LEVEL target: span{fields}: message fields`.
struct JournalFormat;

impl<S, N> FormatEvent<S, N> for JournalFormat
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        write!(
            writer,
            "<{}>{} {}: ",
            priority(meta.level()),
            meta.level(),
            meta.target()
        )?;
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                write!(writer, "{}", span.name())?;
                let ext = span.extensions();
                if let Some(fields) = ext.get::<FormattedFields<N>>() {
                    if !fields.is_empty() {
                        write!(writer, "{{{fields}}}")?;
                    }
                }
                write!(writer, ": ")?;
            }
        }
        ctx.field_format().format_fields(writer.by_ref(), event)?;
        writeln!(writer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_stream_and_priorities() {
        assert_eq!(parse_journal_stream("8:12345"), Some((8, 12345)));
        assert_eq!(parse_journal_stream("8:x"), None);
        assert_eq!(parse_journal_stream(""), None);
        assert_eq!(priority(&Level::ERROR), 3);
        assert_eq!(priority(&Level::WARN), 4);
        assert_eq!(priority(&Level::INFO), 6);
        assert_eq!(priority(&Level::TRACE), 7);
    }
}
