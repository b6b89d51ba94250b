//! Bounds on connections: how many the server serves at once, and how many of
//! them one address may hold. Without them, a client that opens connections and
//! sends nothing (each costs a task and a read buffer) could take all memory or
//! all of the server's attention; with the global bound alone, one address could
//! still take every place.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

/// Connections per address.
pub struct PerAddress {
    max: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// One address's place, given back on drop.
pub struct Place {
    of: Arc<PerAddress>,
    ip: IpAddr,
}

impl PerAddress {
    pub fn new(max: usize) -> Arc<PerAddress> {
        Arc::new(PerAddress {
            max: max.max(1),
            open: Mutex::new(HashMap::new()),
        })
    }

    /// A place for a connection from `ip`, or `None` when its address holds
    /// `max` already. IPv6 addresses count by their /64 (one host usually has a
    /// whole /64 to draw from), IPv4 ones written as IPv6 as IPv4.
    pub fn enter(self: &Arc<Self>, ip: IpAddr) -> Option<Place> {
        let ip = address_of(ip);
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(Place {
            of: self.clone(),
            ip,
        })
    }

    #[cfg(test)]
    fn addresses(&self) -> usize {
        self.open.lock().unwrap().len()
    }
}

/// What counts as one address: see [`PerAddress::enter`].
fn address_of(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut open = self.of.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_holds_at_most_its_share_until_it_closes_some() {
        let p = PerAddress::new(2);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let one = p.enter(a).unwrap();
        let _two = p.enter(a).unwrap();
        assert!(p.enter(a).is_none());
        let _other = p.enter(b).unwrap();
        drop(one);
        let _three = p.enter(a).unwrap();
        drop((_two, _three, _other));
        assert_eq!(p.addresses(), 0, "nothing kept for closed connections");
        // One IPv6 /64 is one address; an IPv4 address written as IPv6 is itself.
        let x: IpAddr = "2001:db8:1:2::5".parse().unwrap();
        let y: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        let z: IpAddr = "2001:db8:1:3::5".parse().unwrap();
        let _x = p.enter(x).unwrap();
        let _y = p.enter(y).unwrap();
        assert!(p.enter(x).is_none(), "the /64 holds two");
        let _z = p.enter(z).unwrap();
        let _v4 = p.enter(a).unwrap();
        let _v4b = p.enter(a).unwrap();
        assert!(p.enter("::ffff:10.0.0.1".parse().unwrap()).is_none());
    }
}
