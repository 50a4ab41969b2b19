//! `'static` copies of the names custom resources are served under.
//!
//! The resource table holds `&'static` rows (built-in kinds are constants),
//! so a custom kind's row and names are leaked once and reused: each
//! distinct string and row is kept once for the life of the process, so
//! re-applying a definition costs nothing and memory grows only with the
//! number of distinct names ever defined.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

static STRINGS: Mutex<Option<HashSet<&'static str>>> = Mutex::new(None);
static LISTS: Mutex<Option<HashMap<Vec<&'static str>, &'static [&'static str]>>> = Mutex::new(None);

/// The one `'static` copy of `s`.
pub fn str(s: &str) -> &'static str {
    let mut set = STRINGS.lock().expect("intern lock");
    let set = set.get_or_insert_with(HashSet::new);
    if let Some(have) = set.get(s) {
        return have;
    }
    let leaked: &'static str = Box::leak(s.to_string().into_boxed_str());
    set.insert(leaked);
    leaked
}

/// The one `'static` copy of a list of names.
pub fn strs<S: AsRef<str>>(items: &[S]) -> &'static [&'static str] {
    let key: Vec<&'static str> = items.iter().map(|s| str(s.as_ref())).collect();
    let mut lists = LISTS.lock().expect("intern lock");
    let lists = lists.get_or_insert_with(HashMap::new);
    if let Some(have) = lists.get(&key) {
        return have;
    }
    let leaked: &'static [&'static str] = Box::leak(key.clone().into_boxed_slice());
    lists.insert(key, leaked);
    leaked
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_names_share_one_copy() {
        let a = str(&String::from("widgets"));
        let b = str("widgets");
        assert!(std::ptr::eq(a, b));
        let l1 = strs(&["w", "wd"]);
        let l2 = strs(&[String::from("w"), String::from("wd")]);
        assert!(std::ptr::eq(l1, l2));
        assert_eq!(l1, &["w", "wd"]);
    }
}
