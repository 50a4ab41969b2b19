//! IPv4 CIDR arithmetic for node IPAM: a cluster range cut into equal
//! node subnets, each free or taken.

use std::net::Ipv4Addr;

/// Why a CIDR could not be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    #[error("{0:?} is not an IPv4 CIDR (a.b.c.d/n)")]
    Parse(String),
    #[error("node mask /{mask} must be at least as long as the cluster CIDR's /{prefix} and at most /30")]
    Mask { prefix: u8, mask: u8 },
    #[error("cluster CIDR /{prefix} holds 2^{bits} node subnets of /{mask}: at most 2^20 are supported, use a longer --cluster-cidr prefix or a shorter --node-cidr-mask-size")]
    TooMany { prefix: u8, mask: u8, bits: u8 },
}

/// An IPv4 network: first address (host bits cleared) and prefix length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    pub base: u32,
    pub prefix: u8,
}

impl Cidr {
    /// Parse `a.b.c.d/n` (host bits are cleared, as Go's ParseCIDR does).
    ///
    /// # Errors
    /// Not an IPv4 CIDR.
    pub fn parse(s: &str) -> Result<Cidr, Error> {
        let bad = || Error::Parse(s.to_string());
        let (ip, len) = s.trim().split_once('/').ok_or_else(bad)?;
        let ip: Ipv4Addr = ip.parse().map_err(|_| bad())?;
        let prefix: u8 = len.parse().map_err(|_| bad())?;
        if prefix > 32 {
            return Err(bad());
        }
        Ok(Cidr {
            base: u32::from(ip) & mask(prefix),
            prefix,
        })
    }

    /// One past the last address, as u64 (a /0 ends at 2^32).
    fn end(&self) -> u64 {
        u64::from(self.base) + (1u64 << (32 - self.prefix))
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", Ipv4Addr::from(self.base), self.prefix)
    }
}

fn mask(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - prefix)
    }
}

/// The node subnets of a cluster range and which are taken.
#[derive(Debug, Clone)]
pub struct CidrSet {
    cluster: Cidr,
    mask: u8,
    used: Vec<bool>,
}

impl CidrSet {
    /// All `/mask` subnets of `cluster`, all free.
    ///
    /// # Errors
    /// The mask is shorter than the cluster prefix, longer than /30, or
    /// makes more than 2^20 subnets.
    pub fn new(cluster: Cidr, mask: u8) -> Result<CidrSet, Error> {
        if mask < cluster.prefix || mask > 30 {
            return Err(Error::Mask {
                prefix: cluster.prefix,
                mask,
            });
        }
        let bits = mask - cluster.prefix;
        if bits > 20 {
            return Err(Error::TooMany {
                prefix: cluster.prefix,
                mask,
                bits,
            });
        }
        Ok(CidrSet {
            cluster,
            mask,
            used: vec![false; 1usize << bits],
        })
    }

    fn subnet(&self, i: usize) -> Cidr {
        let size = 1u64 << (32 - self.mask);
        Cidr {
            base: (u64::from(self.cluster.base) + i as u64 * size) as u32,
            prefix: self.mask,
        }
    }

    /// Indexes of the subnets `c` overlaps.
    fn overlapping(&self, c: Cidr) -> std::ops::Range<usize> {
        let lo = u64::from(c.base).max(u64::from(self.cluster.base));
        let hi = c.end().min(self.cluster.end());
        if lo >= hi {
            return 0..0;
        }
        let size = 1u64 << (32 - self.mask);
        let first = (lo - u64::from(self.cluster.base)) / size;
        let last = (hi - 1 - u64::from(self.cluster.base)) / size;
        first as usize..last as usize + 1
    }

    /// Mark every subnet `c` overlaps as taken; false if `c` lies wholly
    /// outside the cluster range (then it takes nothing).
    pub fn occupy(&mut self, c: Cidr) -> bool {
        let r = self.overlapping(c);
        let any = !r.is_empty();
        for i in r {
            self.used[i] = true;
        }
        any
    }

    /// Free the subnets `c` overlaps.
    pub fn release(&mut self, c: Cidr) {
        for i in self.overlapping(c) {
            self.used[i] = false;
        }
    }

    /// Take the lowest free subnet; None when the range is exhausted.
    pub fn allocate(&mut self) -> Option<Cidr> {
        let i = self.used.iter().position(|u| !u)?;
        self.used[i] = true;
        Some(self.subnet(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Cidr {
        Cidr::parse(s).unwrap()
    }

    #[test]
    fn parse_clears_host_bits_and_rejects_garbage() {
        assert_eq!(c("10.1.2.3/16").to_string(), "10.1.0.0/16");
        assert_eq!(c("0.0.0.0/0").to_string(), "0.0.0.0/0");
        assert!(Cidr::parse("10.0.0.0").is_err());
        assert!(Cidr::parse("10.0.0.0/33").is_err());
        assert!(Cidr::parse("fd00::/64").is_err());
    }

    #[test]
    fn allocates_lowest_free_and_reuses_released() {
        let mut s = CidrSet::new(c("198.18.0.0/22"), 24).unwrap();
        assert!(s.occupy(c("198.18.1.0/24")));
        assert_eq!(s.allocate().unwrap().to_string(), "198.18.0.0/24");
        assert_eq!(s.allocate().unwrap().to_string(), "198.18.2.0/24");
        assert_eq!(s.allocate().unwrap().to_string(), "198.18.3.0/24");
        assert_eq!(s.allocate(), None);
        s.release(c("198.18.2.0/24"));
        assert_eq!(s.allocate().unwrap().to_string(), "198.18.2.0/24");
    }

    #[test]
    fn occupies_by_overlap_and_ignores_outside() {
        let mut s = CidrSet::new(c("198.18.0.0/22"), 24).unwrap();
        assert!(!s.occupy(c("10.0.0.0/24")));
        // A bigger pre-set range takes every subnet inside it.
        assert!(s.occupy(c("198.18.0.0/23")));
        // A smaller one takes the subnet that contains it.
        assert!(s.occupy(c("198.18.3.128/25")));
        assert_eq!(s.allocate().unwrap().to_string(), "198.18.2.0/24");
        assert_eq!(s.allocate(), None);
    }

    #[test]
    fn rejects_bad_masks() {
        assert!(CidrSet::new(c("10.0.0.0/16"), 8).is_err());
        assert!(CidrSet::new(c("10.0.0.0/16"), 31).is_err());
        assert!(CidrSet::new(c("0.0.0.0/0"), 24).is_err());
        assert!(CidrSet::new(c("10.0.0.0/8"), 28).is_ok());
    }
}
