//! Sets of Indexed Job completion indexes in their API form: ordered,
//! comma-separated intervals such as `1,3-5,7` (a Job's
//! `status.completedIndexes` and `status.failedIndexes`, a success
//! policy's `succeededIndexes`).

use std::collections::BTreeSet;
use std::fmt;

/// A set of completion indexes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Indexes(BTreeSet<i32>);

impl Indexes {
    /// Parse `s` strictly, as upstream validates a success policy's
    /// `succeededIndexes`: each index below `completions`, intervals in
    /// increasing order. The error is upstream's wording.
    ///
    /// # Errors
    /// The text is not an ordered interval list within `0..completions`.
    pub fn parse(s: &str, completions: i32) -> Result<Indexes, String> {
        let mut out = BTreeSet::new();
        if s.is_empty() {
            return Ok(Indexes(out));
        }
        let mut last: Option<i32> = None;
        for fragment in s.split(',') {
            let parts: Vec<&str> = fragment.split('-').collect();
            if parts.len() > 2 {
                return Err(format!("the fragment {fragment:?} violates the requirement that an index interval can have at most two parts separated by '-'"));
            }
            let mut bound = |text: &str| -> Result<i32, String> {
                let x: i32 = text.parse().ok().filter(|x| *x >= 0).ok_or_else(|| {
                    format!("cannot convert string to integer for index: {text:?}")
                })?;
                if x >= completions {
                    return Err(format!("too large index: {text:?}"));
                }
                if let Some(prev) = last.filter(|prev| *prev >= x) {
                    return Err(format!(
                        "non-increasing order, previous: {prev}, current: {x}"
                    ));
                }
                last = Some(x);
                Ok(x)
            };
            let first = bound(parts[0])?;
            let end = match parts.get(1) {
                Some(y) => bound(y)?,
                None => first,
            };
            out.extend(first..=end);
        }
        Ok(Indexes(out))
    }

    /// Read a Job's status field, keeping what is valid below `completions`
    /// and skipping the rest, as the Job controller does with what another
    /// writer may have left.
    pub fn parse_lenient(s: &str, completions: i32) -> Indexes {
        let mut out = BTreeSet::new();
        for fragment in s.split(',').filter(|f| !f.is_empty()) {
            let mut parts = fragment.splitn(2, '-').map(|p| p.parse::<i32>().ok());
            let (Some(Some(first)), end) = (parts.next(), parts.next()) else {
                continue;
            };
            let end = match end {
                None => first,
                Some(Some(e)) => e,
                Some(None) => continue,
            };
            out.extend((first.max(0)..=end.min(completions - 1)).filter(|i| *i >= 0));
        }
        Indexes(out)
    }

    pub fn contains(&self, i: i32) -> bool {
        self.0.contains(&i)
    }

    /// Whether `i` was newly added.
    pub fn insert(&mut self, i: i32) -> bool {
        self.0.insert(i)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = i32> + '_ {
        self.0.iter().copied()
    }
}

impl FromIterator<i32> for Indexes {
    fn from_iter<T: IntoIterator<Item = i32>>(iter: T) -> Self {
        Indexes(iter.into_iter().collect())
    }
}

/// The compressed interval form (`1,3-5,7`; empty for no index).
impl fmt::Display for Indexes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut it = self.0.iter().copied().peekable();
        let mut first = true;
        while let Some(start) = it.next() {
            let mut end = start;
            while it.peek() == Some(&(end + 1)) {
                end += 1;
                it.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if end == start {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_the_compressed_form() {
        let ix = Indexes::parse("1,3-5,7", 10).unwrap();
        assert_eq!(ix.iter().collect::<Vec<_>>(), [1, 3, 4, 5, 7]);
        assert_eq!(ix.to_string(), "1,3-5,7");
        let ix: Indexes = [0, 1, 2, 4].into_iter().collect();
        assert_eq!(ix.to_string(), "0-2,4");
        assert_eq!(Indexes::default().to_string(), "");
        assert!(Indexes::parse("", 3).unwrap().is_empty());
    }

    #[test]
    fn strict_parsing_speaks_upstream() {
        for (s, want) in [
            ("1-2-3", "at most two parts"),
            ("a", "cannot convert string to integer for index: \"a\""),
            ("-1", "cannot convert string to integer for index: \"\""),
            ("5", "too large index: \"5\""),
            ("3,1", "non-increasing order, previous: 3, current: 1"),
            ("1-1", "non-increasing order, previous: 1, current: 1"),
            ("0-2,2", "non-increasing order, previous: 2, current: 2"),
        ] {
            let err = Indexes::parse(s, 5).unwrap_err();
            assert!(err.contains(want), "{s}: {err}");
        }
    }

    #[test]
    fn lenient_parsing_keeps_what_is_valid() {
        let ix = Indexes::parse_lenient("0,x,2-9,-3", 5);
        assert_eq!(ix.to_string(), "0,2-4");
    }
}
