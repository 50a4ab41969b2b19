//! Stable slot numbers for a service's endpoints. Load balancing picks
//! slot `random mod N`, so which endpoint holds which slot does not
//! matter to traffic, but it matters to cost: keeping every surviving
//! endpoint in its slot turns "one endpoint changed" into one or two
//! element updates instead of a rewrite of every slot after it.

use std::collections::HashSet;
use std::net::Ipv4Addr;

/// An endpoint's identity for slotting.
pub type Addr = (Ipv4Addr, u16);

/// The new slot order for `now`, given the previous order: survivors keep
/// their slots, newcomers fill the holes left by removed endpoints, and
/// when there are more holes than newcomers the last endpoints move down
/// into them. The result holds exactly the addresses of `now`.
pub fn assign(prev: &[Addr], now: &[Addr]) -> Vec<Addr> {
    let wanted: HashSet<&Addr> = now.iter().collect();
    let kept: HashSet<&Addr> = prev.iter().filter(|a| wanted.contains(a)).collect();
    let mut newcomers = now.iter().filter(|a| !kept.contains(a));
    let mut slots: Vec<Option<Addr>> = prev
        .iter()
        .map(|a| wanted.contains(a).then_some(*a))
        .collect();
    for slot in slots.iter_mut().filter(|s| s.is_none()) {
        match newcomers.next() {
            Some(a) => *slot = Some(*a),
            None => break,
        }
    }
    slots.extend(newcomers.map(|a| Some(*a)));
    // Close the remaining holes from the tail.
    let mut i = 0;
    while i < slots.len() {
        if slots[i].is_none() {
            let mut last = slots.pop().flatten();
            while last.is_none() && slots.len() > i {
                last = slots.pop().flatten();
            }
            match last {
                Some(a) if i < slots.len() => slots[i] = Some(a),
                Some(a) => slots.push(Some(a)),
                None => {}
            }
        }
        i += 1;
    }
    slots.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(n: u8) -> Addr {
        (Ipv4Addr::new(198, 18, 0, n), 80)
    }

    fn changed(prev: &[Addr], next: &[Addr]) -> usize {
        let common = prev.len().min(next.len());
        (0..common).filter(|&i| prev[i] != next[i]).count() + prev.len().abs_diff(next.len())
    }

    #[test]
    fn survivors_keep_their_slots() {
        let prev = [a(1), a(2), a(3), a(4), a(5)];
        // One replaced: one slot changes.
        let next = assign(&prev, &[a(1), a(2), a(9), a(4), a(5)]);
        assert_eq!(next, [a(1), a(2), a(9), a(4), a(5)]);
        // One removed from the middle: the last moves into its slot.
        let next = assign(&prev, &[a(1), a(2), a(4), a(5)]);
        assert_eq!(next, [a(1), a(2), a(5), a(4)]);
        assert_eq!(changed(&prev, &next), 2);
        // One added: appended.
        let next = assign(&prev, &[a(6), a(1), a(2), a(3), a(4), a(5)]);
        assert_eq!(next, [a(1), a(2), a(3), a(4), a(5), a(6)]);
        // Several removed, including the tail.
        let next = assign(&prev, &[a(2), a(3)]);
        assert_eq!(next.len(), 2);
        assert!(next.contains(&a(2)) && next.contains(&a(3)));
        assert_eq!(next[1], a(2), "a survivor whose slot is in range stays");
        // From nothing, and to nothing.
        assert_eq!(assign(&[], &[a(3), a(1)]), [a(3), a(1)]);
        assert!(assign(&prev, &[]).is_empty());
    }

    #[test]
    fn result_is_always_exactly_the_wanted_set() {
        // A small exhaustive-ish sweep over subsets.
        let all: Vec<Addr> = (1..=6).map(a).collect();
        for pm in 0u32..64 {
            for nm in 0u32..64 {
                let prev: Vec<Addr> = (0..6)
                    .filter(|i| pm & (1 << i) != 0)
                    .map(|i| all[i])
                    .collect();
                let now: Vec<Addr> = (0..6)
                    .filter(|i| nm & (1 << i) != 0)
                    .map(|i| all[i])
                    .collect();
                let mut got = assign(&prev, &now);
                assert_eq!(got.len(), now.len());
                got.sort();
                let mut want = now.clone();
                want.sort();
                assert_eq!(got, want, "prev {prev:?} now {now:?}");
            }
        }
    }
}
