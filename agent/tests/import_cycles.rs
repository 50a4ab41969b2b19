//! No import cycles between the modules of the agent (and of the proxy and
//! DNS crates in `proxy/` and `dns/` beside it): the module graph is read from the sources, so a
//! cycle that comes back fails here rather than in a review.
//!
//! A module is a file (`foo.rs`, `foo/mod.rs`). An edge runs from a module
//! to every other module a `use` or a path in its code names (`crate::`,
//! `super::`, `self::` or a child module's name), test code left out.
//! Edges from a module to its own ancestors do not count: a child is part
//! of its parent, and using the parent's types (`super::Thing`) while the
//! parent re-exports or calls its children is how a Rust module tree is
//! laid out. What must not exist is separate modules that need each other
//! (then none of them can be read, tested or moved alone).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// Module path (`["runtime", "container"]`) per source file of a crate.
fn modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src dir") {
            let path = entry.expect("dir entry").path();
            let rel = path.strip_prefix(src).expect("under src");
            // Binaries are crates of their own.
            if rel.starts_with("bin") {
                continue;
            }
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let mut segs: Vec<String> = rel
                .with_extension("")
                .iter()
                .map(|s| s.to_string_lossy().into_owned())
                .collect();
            if matches!(segs.last().map(String::as_str), Some("mod" | "lib")) {
                segs.pop();
            }
            out.insert(segs, path);
        }
    }
    out
}

fn is_test_cfg(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && a.parse_args::<syn::Meta>()
                .is_ok_and(|m| m.path().is_ident("test"))
    })
}

/// Collects the paths a module's (non-test) code names, each already
/// resolved to an absolute module-relative path.
struct Paths<'a> {
    here: &'a [String],
    known: &'a BTreeMap<Vec<String>, PathBuf>,
    found: BTreeSet<Vec<String>>,
}

impl Paths<'_> {
    fn resolve(&self, segs: &[String]) -> Option<Vec<String>> {
        let first = segs.first()?;
        let mut base: Vec<String> = match first.as_str() {
            "crate" => Vec::new(),
            "self" => self.here.to_vec(),
            "super" => {
                let mut b = self.here.to_vec();
                let mut rest = segs;
                while rest.first().is_some_and(|s| s == "super") {
                    b.pop();
                    rest = &rest[1..];
                }
                b.extend(rest.iter().cloned());
                return Some(b);
            }
            name => {
                // A child module named without `self::`.
                let mut child = self.here.to_vec();
                child.push(name.to_string());
                if !self.known.contains_key(&child) {
                    return None;
                }
                self.here.to_vec()
            }
        };
        let skip = usize::from(first == "crate" || first == "self");
        base.extend(segs[skip..].iter().cloned());
        Some(base)
    }

    fn add(&mut self, segs: Vec<String>) {
        if let Some(p) = self.resolve(&segs) {
            self.found.insert(p);
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, t: &syn::UseTree) {
        match t {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut s = prefix.clone();
                if n.ident != "self" {
                    s.push(n.ident.to_string());
                }
                self.add(s);
            }
            syn::UseTree::Rename(r) => {
                let mut s = prefix.clone();
                s.push(r.ident.to_string());
                self.add(s);
            }
            syn::UseTree::Glob(_) => self.add(prefix.clone()),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Paths<'_> {
    fn visit_item(&mut self, i: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match i {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Impl(m) => &m.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Struct(s) => &s.attrs,
            _ => &[],
        };
        if is_test_cfg(attrs) {
            return;
        }
        syn::visit::visit_item(self, i);
    }

    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        if p.leading_colon.is_none() && p.segments.len() > 1 {
            let segs = p.segments.iter().map(|s| s.ident.to_string()).collect();
            self.add(segs);
        }
        syn::visit::visit_path(self, p);
    }
}

/// The longest known module that `path` lies in.
fn owner(known: &BTreeMap<Vec<String>, PathBuf>, path: &[String]) -> Vec<String> {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| known.contains_key(p))
        .unwrap_or_default()
}

/// The module graph of the crate whose sources are in `src`.
fn graph(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let known = modules(src);
    let mut edges = BTreeMap::new();
    for (module, path) in &known {
        let text = std::fs::read_to_string(path).expect("read source");
        let file = syn::parse_file(&text)
            .unwrap_or_else(|e| panic!("{}: does not parse: {e}", path.display()));
        let mut v = Paths {
            here: module,
            known: &known,
            found: BTreeSet::new(),
        };
        v.visit_file(&file);
        let to: BTreeSet<Vec<String>> = v
            .found
            .iter()
            .map(|p| owner(&known, p))
            .filter(|t| !module.starts_with(t))
            .collect();
        edges.insert(module.clone(), to);
    }
    edges
}

/// Every cycle's modules (the strongly connected components with more than
/// one module), by Tarjan's algorithm.
fn cycles(g: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<String>> {
    struct State<'a> {
        g: &'a BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'a [String], (usize, usize)>,
        stack: Vec<&'a [String]>,
        on_stack: BTreeSet<&'a [String]>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a [String]) {
        s.index.insert(v, (s.next, s.next));
        s.next += 1;
        s.stack.push(v);
        s.on_stack.insert(v);
        for w in s.g.get(v).into_iter().flatten() {
            let w = w.as_slice();
            if !s.index.contains_key(w) {
                visit(s, w);
                let low = s.index[w].1.min(s.index[v].1);
                s.index.get_mut(v).expect("visited").1 = low;
            } else if s.on_stack.contains(w) {
                let low = s.index[w].0.min(s.index[v].1);
                s.index.get_mut(v).expect("visited").1 = low;
            }
        }
        if s.index[v].0 == s.index[v].1 {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on_stack.remove(w);
                comp.push(display(w));
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        g,
        index: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in g.keys() {
        if !s.index.contains_key(v.as_slice()) {
            visit(&mut s, v);
        }
    }
    s.out
}

fn display(m: &[String]) -> String {
    if m.is_empty() {
        "crate".into()
    } else {
        m.join("::")
    }
}

fn assert_acyclic(src: &Path) {
    let g = graph(src);
    let found = cycles(&g);
    let explain: Vec<String> = found
        .iter()
        .map(|c| {
            let inside = |m: &str| c.iter().any(|x| x == m);
            let edges: Vec<String> = c
                .iter()
                .flat_map(|from| {
                    let key: Vec<String> = if from == "crate" {
                        Vec::new()
                    } else {
                        from.split("::").map(String::from).collect()
                    };
                    g[&key]
                        .iter()
                        .map(|t| display(t))
                        .filter(|t| inside(t))
                        .map(move |t| format!("{from} -> {t}"))
                })
                .collect();
            format!("[{}]: {}", c.join(", "), edges.join("; "))
        })
        .collect();
    assert!(
        found.is_empty(),
        "import cycles in {}:\n{}",
        src.display(),
        explain.join("\n")
    );
}

#[test]
fn agent_modules_have_no_import_cycles() {
    assert_acyclic(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
}

#[test]
fn proxy_and_dns_modules_have_no_import_cycles() {
    let agent = Path::new(env!("CARGO_MANIFEST_DIR"));
    assert_acyclic(&agent.join("proxy/src"));
    assert_acyclic(&agent.join("dns/src"));
}

#[test]
fn the_detector_finds_a_cycle() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("net")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod a; pub mod b; pub mod net;").unwrap();
    std::fs::write(src.join("a.rs"), "use crate::b::B; pub struct A;").unwrap();
    std::fs::write(src.join("b.rs"), "pub struct B(crate::a::A);").unwrap();
    std::fs::write(src.join("net/mod.rs"), "pub mod x; pub mod y; use x::X;").unwrap();
    std::fs::write(src.join("net/x.rs"), "use super::y::Y; pub struct X;").unwrap();
    std::fs::write(
        src.join("net/y.rs"),
        "pub struct Y; fn f() { super::x::X; } #[cfg(test)] mod tests { use crate::a::A; }",
    )
    .unwrap();
    let found = cycles(&graph(src));
    assert_eq!(
        found,
        vec![
            vec!["a".to_string(), "b".into()],
            vec!["net::x".into(), "net::y".into()]
        ]
    );
}
