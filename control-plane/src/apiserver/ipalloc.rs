//! Service ClusterIP and NodePort allocation.
//!
//! The allocated set is rebuilt from the stored services at start-up and
//! kept in memory; the store stays the truth (a crash between allocation and
//! write leaks nothing, since the set is recomputed on restart).

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::Mutex;

/// Allocation errors (answered as 422 on `spec.clusterIP`).
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("invalid service CIDR {0:?}: expected an IPv4 network like 10.43.0.0/16")]
    BadCidr(String),
    #[error("provided IP {0} is not in the valid range. The range of valid IPs is {1}")]
    OutOfRange(Ipv4Addr, String),
    #[error("provided IP {0} is already allocated")]
    Taken(Ipv4Addr),
    #[error("range is full")]
    Full,
    #[error("provided port {0} is already allocated")]
    PortTaken(u16),
    #[error(
        "provided port {0} is not in the valid range. The range of valid ports is 30000-32767"
    )]
    PortOutOfRange(u16),
}

/// A parsed IPv4 CIDR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub base: u32,
    pub bits: u8,
}

impl Cidr {
    pub fn parse(s: &str) -> Result<Self, Error> {
        let (ip, bits) = s.split_once('/').ok_or_else(|| Error::BadCidr(s.into()))?;
        let ip: Ipv4Addr = ip.parse().map_err(|_| Error::BadCidr(s.into()))?;
        let bits: u8 = bits.parse().map_err(|_| Error::BadCidr(s.into()))?;
        if !(8..=30).contains(&bits) {
            return Err(Error::BadCidr(s.into()));
        }
        let mask = u32::MAX << (32 - bits);
        Ok(Cidr {
            base: u32::from(ip) & mask,
            bits,
        })
    }
    pub fn size(&self) -> u32 {
        1u32 << (32 - self.bits)
    }
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = u32::MAX << (32 - self.bits);
        u32::from(ip) & mask == self.base
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.base), self.bits)
    }
}

/// ClusterIPs and NodePorts in use.
#[derive(Debug)]
pub struct Allocator {
    pub cidr: Cidr,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    ips: HashSet<u32>,
    ports: HashSet<u16>,
    next: u32,
}

impl Allocator {
    pub fn new(cidr: Cidr) -> Self {
        Allocator {
            cidr,
            state: Mutex::new(State {
                next: 2,
                ..Default::default()
            }),
        }
    }

    /// The first address (`.1`), which upstream gives the `kubernetes` service.
    pub fn first(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.cidr.base + 1)
    }

    /// Mark an address taken (services found at start-up).
    pub fn mark(&self, ip: &str) {
        if let Ok(ip) = ip.parse::<Ipv4Addr>() {
            if self.cidr.contains(ip) {
                self.state
                    .lock()
                    .expect("alloc lock")
                    .ips
                    .insert(u32::from(ip));
            }
        }
    }

    pub fn mark_port(&self, port: u16) {
        self.state.lock().expect("alloc lock").ports.insert(port);
    }

    /// Reserve `want`, or the next free address when None.
    pub fn allocate(&self, want: Option<Ipv4Addr>) -> Result<Ipv4Addr, Error> {
        let mut st = self.state.lock().expect("alloc lock");
        if let Some(ip) = want {
            let off = u32::from(ip).wrapping_sub(self.cidr.base);
            if !self.cidr.contains(ip) || off == 0 || off == self.cidr.size() - 1 {
                return Err(Error::OutOfRange(ip, self.cidr.to_string()));
            }
            if !st.ips.insert(u32::from(ip)) {
                return Err(Error::Taken(ip));
            }
            return Ok(ip);
        }
        let size = self.cidr.size();
        // Skip the network address, .1 (reserved for the API's own service)
        // and the broadcast address.
        for _ in 0..size {
            let off = st.next;
            st.next = if st.next + 1 >= size - 1 {
                2
            } else {
                st.next + 1
            };
            let ip = self.cidr.base + off;
            if off >= 2 && off < size - 1 && st.ips.insert(ip) {
                return Ok(Ipv4Addr::from(ip));
            }
        }
        Err(Error::Full)
    }

    pub fn release(&self, ip: &str) {
        if let Ok(ip) = ip.parse::<Ipv4Addr>() {
            self.state
                .lock()
                .expect("alloc lock")
                .ips
                .remove(&u32::from(ip));
        }
    }

    /// Reserve a NodePort: `want`, or a random free one in 30000-32767.
    pub fn allocate_port(&self, want: Option<u16>) -> Result<u16, Error> {
        use rand::Rng;
        let mut st = self.state.lock().expect("alloc lock");
        if let Some(p) = want {
            if !(30000..=32767).contains(&p) {
                return Err(Error::PortOutOfRange(p));
            }
            if !st.ports.insert(p) {
                return Err(Error::PortTaken(p));
            }
            return Ok(p);
        }
        let mut rng = rand::rng();
        for _ in 0..10_000 {
            let p = rng.random_range(30000..=32767u16);
            if st.ports.insert(p) {
                return Ok(p);
            }
        }
        Err(Error::Full)
    }

    pub fn release_port(&self, p: u16) {
        self.state.lock().expect("alloc lock").ports.remove(&p);
    }
}

/// What one write took from an [`Allocator`], to give back if the write
/// fails.
#[derive(Debug, Default)]
pub struct Allocation {
    ips: Vec<String>,
    ports: Vec<u16>,
}

impl Allocation {
    pub fn ip(&mut self, ip: String) {
        self.ips.push(ip);
    }

    pub fn port(&mut self, port: u16) {
        self.ports.push(port);
    }

    /// Return everything to `to`.
    pub fn release(self, to: &Allocator) {
        for ip in &self.ips {
            to.release(ip);
        }
        for p in self.ports {
            to.release_port(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_in_range_without_reuse() {
        let a = Allocator::new(Cidr::parse("198.19.0.0/29").unwrap());
        let got: Vec<Ipv4Addr> = (0..5).map(|_| a.allocate(None).unwrap()).collect();
        assert_eq!(got[0], "198.19.0.2".parse::<Ipv4Addr>().unwrap());
        assert_eq!(a.allocate(None), Err(Error::Full));
        a.release("198.19.0.4");
        assert_eq!(
            a.allocate(None).unwrap(),
            "198.19.0.4".parse::<Ipv4Addr>().unwrap()
        );
        assert!(matches!(
            a.allocate(Some("10.0.0.1".parse().unwrap())),
            Err(Error::OutOfRange(..))
        ));
        assert!(Cidr::parse("nope").is_err());
    }
}
