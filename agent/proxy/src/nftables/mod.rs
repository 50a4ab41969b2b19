//! nftables mode: one table of the proxy's own (`ip skiff-proxy`), maps
//! keyed by address . protocol . port so that a packet's lookup is O(1)
//! whatever the number of services, and every change applied as one
//! `nft -f` transaction.
//!
//! The first sync (and any sync after a failure) replaces the whole table
//! atomically; after that, each sync writes only what the changed service
//! ports touch: the proxier remembers what it programmed for each of them
//! ([`objects::Objects`]) and emits the difference.

pub mod objects;
mod script;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use self::objects::{Context, Map, Objects, Shared};
use super::model::{ServicePort, ServicePortName, Targets};
use super::slots::{self, Addr};
use super::{Basis, Change, SyncStats};

pub use self::script::{cleanup_script, Full, TABLE};

/// The nftables proxier's memory of what is in the kernel.
#[derive(Debug, Default)]
pub struct Proxier {
    /// The pod CIDR and whether the kernel holds what was written.
    pub basis: Basis,
    /// What each service port put in the table.
    programmed: BTreeMap<ServicePortName, Objects>,
    /// Slot order of each service port's cluster and local endpoints.
    slots: HashMap<(ServicePortName, bool), Vec<Addr>>,
    /// Map elements and the service ports that want them; the first
    /// owner's value is the one in the kernel. Keys shared by two owners
    /// are hairpin entries (one pod behind two services) or conflicting
    /// external IPs.
    owners: HashMap<(Map, String), Vec<(ServicePortName, String)>>,
    /// Shared chains that exist in the table.
    shared: BTreeSet<Shared>,
}

/// One transaction's statements, by phase: objects are created before
/// anything refers to them and deleted after nothing does.
#[derive(Debug, Default)]
struct Tx {
    add_sets: Vec<String>,
    add_chains: Vec<String>,
    rules: Vec<String>,
    del_elements: BTreeMap<Map, Vec<String>>,
    add_elements: BTreeMap<Map, Vec<String>>,
    flush_doomed: Vec<String>,
    del_chains: Vec<String>,
    del_sets: Vec<String>,
    stats: SyncStats,
}

impl Proxier {
    pub fn new(local_cidr: Option<String>) -> Proxier {
        Proxier {
            basis: Basis::new(local_cidr),
            ..Default::default()
        }
    }

    /// Elements, chains and sets currently programmed (for metrics).
    pub fn programmed(&self) -> (usize, usize) {
        let elements = self.owners.len();
        let chains = self.shared.len()
            + self
                .programmed
                .values()
                .map(|o| o.chains.len())
                .sum::<usize>();
        (elements, chains)
    }

    /// The script that writes the whole table with `all`, and resets the
    /// proxier's memory to it. Call [`Self::commit`] once it is applied.
    /// `Full::Replace` after a start or a failure; `Full::Repair` for the
    /// periodic resync, which keeps session affinity state (and, so that
    /// no chain it wrote is forgotten, every shared chain).
    pub fn full_sync<'a>(
        &mut self,
        mode: Full,
        all: impl IntoIterator<Item = (&'a ServicePort, &'a Targets)>,
    ) -> (String, SyncStats) {
        let old = std::mem::take(&mut self.programmed);
        self.slots.clear();
        self.owners.clear();
        let mut tx = Tx::default();
        match mode {
            Full::Replace => self.shared.clear(),
            Full::Repair => {
                for shared in &self.shared {
                    tx.add_chains.push(shared.name());
                    for rule in shared.rules(self.basis.local_cidr.as_deref()) {
                        tx.rules.push(script::add_rule(&shared.name(), &rule));
                    }
                }
            }
        }
        for (svc, targets) in all {
            let objects = self.objects_for(svc, targets);
            self.diff(&svc.name, &Objects::default(), &objects, &mut tx);
            self.programmed.insert(svc.name.clone(), objects);
            tx.stats.service_ports += 1;
        }
        // Repairing keeps the table: chains and sets of services gone since
        // the last sync must go explicitly.
        let mut tail = Vec::new();
        if mode == Full::Repair {
            let live = |f: fn(&Objects) -> Vec<&String>| -> BTreeSet<String> {
                self.programmed.values().flat_map(f).cloned().collect()
            };
            let chains = live(|o| o.chains.keys().collect());
            let sets = live(|o| o.sets.keys().collect());
            let gone_chains: BTreeSet<&String> = old
                .values()
                .flat_map(|o| o.chains.keys())
                .filter(|c| !chains.contains(*c))
                .collect();
            tail.extend(gone_chains.iter().map(|c| script::flush_chain(c)));
            tail.extend(gone_chains.iter().map(|c| script::delete_chain(c)));
            let gone_sets: BTreeSet<&String> = old
                .values()
                .flat_map(|o| o.sets.keys())
                .filter(|s| !sets.contains(*s))
                .collect();
            tail.extend(gone_sets.iter().map(|s| script::delete_set(s)));
        }
        let mut text = script::full(
            mode,
            &tx.add_sets,
            &tx.add_chains,
            &tx.rules,
            &tx.add_elements,
        );
        for line in tail {
            text.push_str(&line);
            text.push('\n');
        }
        (text, tx.stats)
    }

    /// The script for what changed. Empty when nothing in the kernel needs
    /// to change.
    pub fn partial_sync(&mut self, changes: &[Change]) -> (String, SyncStats) {
        let mut tx = Tx::default();
        for change in changes {
            let old_names = change.known_ports(&self.programmed);
            let mut seen = BTreeSet::new();
            for (svc, targets) in &change.ports {
                let new = self.objects_for(svc, targets);
                let old = self.programmed.remove(&svc.name).unwrap_or_default();
                if old != new {
                    self.diff(&svc.name, &old, &new, &mut tx);
                    tx.stats.service_ports += 1;
                }
                self.programmed.insert(svc.name.clone(), new);
                seen.insert(svc.name.clone());
            }
            for name in old_names.into_iter().filter(|n| !seen.contains(n)) {
                let old = self.programmed.remove(&name).unwrap_or_default();
                self.diff(&name, &old, &Objects::default(), &mut tx);
                self.slots.remove(&(name.clone(), false));
                self.slots.remove(&(name, true));
                tx.stats.service_ports += 1;
            }
        }
        let text = script::partial(&tx);
        (text, tx.stats)
    }

    /// The service port's objects, its endpoints in stable slot order.
    fn objects_for(&mut self, svc: &ServicePort, targets: &Targets) -> Objects {
        let mut ordered = targets.clone();
        for (local, eps) in [(false, &mut ordered.cluster), (true, &mut ordered.local)] {
            let key = (svc.name.clone(), local);
            let prev = self.slots.get(&key).map(Vec::as_slice).unwrap_or(&[]);
            let now: Vec<Addr> = eps.iter().map(objects::addr).collect();
            let order = slots::assign(prev, &now);
            let mut by_addr: HashMap<Addr, _> =
                eps.drain(..).map(|e| (objects::addr(&e), e)).collect();
            eps.extend(order.iter().filter_map(|a| by_addr.remove(a)));
            self.slots.insert(key, order);
        }
        let ctx = Context {
            local_cidr: self.basis.local_cidr.as_deref(),
        };
        objects::build(svc, &ordered, &ctx)
    }

    /// Statements turning `old` into `new` for one service port.
    fn diff(&mut self, owner: &ServicePortName, old: &Objects, new: &Objects, tx: &mut Tx) {
        for shared in &new.shared {
            if self.shared.insert(*shared) {
                tx.add_chains.push(shared.name());
                for rule in shared.rules(self.basis.local_cidr.as_deref()) {
                    tx.rules.push(script::add_rule(&shared.name(), &rule));
                }
            }
        }
        for (name, spec) in &new.sets {
            if !old.sets.contains_key(name) {
                tx.add_sets.push(script::add_set(name, spec));
            }
        }
        for (name, rules) in &new.chains {
            match old.chains.get(name) {
                Some(r) if r == rules => continue,
                Some(_) => tx.rules.push(script::flush_chain(name)),
                None => tx.add_chains.push(name.clone()),
            }
            for rule in rules {
                tx.rules.push(script::add_rule(name, rule));
            }
            tx.stats.chains += 1;
        }
        for (key, value) in &new.elements {
            if old.elements.get(key) != Some(value) {
                self.own(key, owner, Some(value), tx);
            }
        }
        for key in old.elements.keys() {
            if !new.elements.contains_key(key) {
                self.own(key, owner, None, tx);
            }
        }
        for name in old.chains.keys() {
            if !new.chains.contains_key(name) {
                tx.flush_doomed.push(script::flush_chain(name));
                tx.del_chains.push(script::delete_chain(name));
                tx.stats.chains += 1;
            }
        }
        for name in old.sets.keys() {
            if !new.sets.contains_key(name) {
                tx.del_sets.push(script::delete_set(name));
            }
        }
    }

    /// Set (`Some`) or drop (`None`) `owner`'s value for a map element and
    /// emit the change of the value the kernel holds, if any.
    fn own(
        &mut self,
        key: &(Map, String),
        owner: &ServicePortName,
        value: Option<&String>,
        tx: &mut Tx,
    ) {
        let entry = self.owners.entry(key.clone()).or_default();
        let before = entry.first().map(|(_, v)| v.clone());
        match value {
            Some(v) => match entry.iter_mut().find(|(o, _)| o == owner) {
                Some(slot) => slot.1 = v.clone(),
                None => entry.push((owner.clone(), v.clone())),
            },
            None => entry.retain(|(o, _)| o != owner),
        }
        let after = entry.first().map(|(_, v)| v.clone());
        if entry.is_empty() {
            self.owners.remove(key);
        }
        if before == after {
            return;
        }
        let (map, k) = key;
        if before.is_some() {
            tx.del_elements.entry(*map).or_default().push(k.clone());
        }
        if let Some(v) = after {
            tx.add_elements
                .entry(*map)
                .or_default()
                .push(script::element(k, &v));
        }
        tx.stats.elements += 1;
    }
}

#[cfg(test)]
mod tests;
