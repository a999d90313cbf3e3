//! A fault-injecting layer between a device's socket and its engine, for
//! testing on real networks where the kernel has no `netem`: received
//! datagrams are dropped, duplicated, corrupted (one bit flipped) or held
//! back (delay, and so reordering) with configured probabilities, from a
//! seeded generator. Enabled by `UROCE_FAULTS` or a device's `faults` in the
//! configuration file, e.g. `loss=0.01,dup=0.01,reorder=0.02,corrupt=0.001,
//! delay_us=300,seed=7`. Off by default; never on the fast path otherwise.

use std::collections::BinaryHeap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Probabilities (0..1) and the delay bound.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FaultConfig {
    pub loss: f64,
    pub duplicate: f64,
    pub reorder: f64,
    pub corrupt: f64,
    /// Held packets wait up to this long.
    pub delay: Duration,
    pub seed: u64,
}

impl std::str::FromStr for FaultConfig {
    type Err = String;

    fn from_str(s: &str) -> Result<FaultConfig, String> {
        let mut c = FaultConfig {
            loss: 0.0,
            duplicate: 0.0,
            reorder: 0.0,
            corrupt: 0.0,
            delay: Duration::from_micros(200),
            seed: 1,
        };
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part.split_once('=').ok_or_else(|| format!("faults: `{part}` is not key=value"))?;
            let p = || -> Result<f64, String> {
                let x: f64 = v.parse().map_err(|_| format!("faults: {k}: `{v}` is not a number"))?;
                if (0.0..=1.0).contains(&x) {
                    Ok(x)
                } else {
                    Err(format!("faults: {k}: {x} is not a probability"))
                }
            };
            match k {
                "loss" => c.loss = p()?,
                "dup" | "duplicate" => c.duplicate = p()?,
                "reorder" => c.reorder = p()?,
                "corrupt" => c.corrupt = p()?,
                "delay_us" => {
                    c.delay = Duration::from_micros(v.parse().map_err(|_| format!("faults: delay_us: `{v}`"))?)
                }
                "seed" => c.seed = v.parse().map_err(|_| format!("faults: seed: `{v}`"))?,
                _ => return Err(format!("faults: unknown key `{k}` (loss, dup, reorder, corrupt, delay_us, seed)")),
            }
        }
        Ok(c)
    }
}

struct Held {
    at: Instant,
    seq: u64,
    from: SocketAddr,
    data: Vec<u8>,
}

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        (self.at, self.seq) == (o.at, o.seq)
    }
}
impl Eq for Held {}
impl Ord for Held {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.at, o.seq).cmp(&(self.at, self.seq)) // min-heap
    }
}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}

/// What the layer did, for logs and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct FaultStats {
    pub seen: u64,
    pub lost: u64,
    pub duplicated: u64,
    pub corrupted: u64,
    pub held: u64,
}

struct State {
    rng: u64,
    held: BinaryHeap<Held>,
    seq: u64,
    stats: FaultStats,
}

pub struct FaultLayer {
    cfg: FaultConfig,
    st: Mutex<State>,
}

impl FaultLayer {
    pub fn new(cfg: FaultConfig) -> FaultLayer {
        FaultLayer {
            cfg,
            st: Mutex::new(State {
                rng: cfg.seed ^ 0x9E37_79B9_7F4A_7C15,
                held: BinaryHeap::new(),
                seq: 0,
                stats: FaultStats::default(),
            }),
        }
    }

    #[cfg(feature = "unstable")]
    pub fn stats(&self) -> FaultStats {
        self.st.lock().unwrap().stats
    }

    /// Passes a received datagram through the faults; what is delivered now
    /// is appended to `out` as (sender, bytes).
    pub fn receive(&self, now: Instant, from: SocketAddr, data: &[u8], out: &mut Vec<(SocketAddr, Vec<u8>)>) {
        let mut st = self.st.lock().unwrap();
        st.stats.seen += 1;
        if chance(&mut st.rng, self.cfg.loss) {
            st.stats.lost += 1;
            return;
        }
        let copies = if chance(&mut st.rng, self.cfg.duplicate) {
            st.stats.duplicated += 1;
            2
        } else {
            1
        };
        for _ in 0..copies {
            let mut d = data.to_vec();
            if !d.is_empty() && chance(&mut st.rng, self.cfg.corrupt) {
                let i = (next(&mut st.rng) % d.len() as u64) as usize;
                d[i] ^= 1 << (next(&mut st.rng) % 8);
                st.stats.corrupted += 1;
            }
            if chance(&mut st.rng, self.cfg.reorder) {
                let wait = Duration::from_nanos(next(&mut st.rng) % (self.cfg.delay.as_nanos() as u64 + 1));
                st.seq += 1;
                st.stats.held += 1;
                let seq = st.seq;
                st.held.push(Held { at: now + wait, seq, from, data: d });
            } else {
                out.push((from, d));
            }
        }
    }

    /// Held datagrams whose time has come.
    pub fn release(&self, now: Instant, out: &mut Vec<(SocketAddr, Vec<u8>)>) {
        let mut st = self.st.lock().unwrap();
        while st.held.peek().is_some_and(|h| h.at <= now) {
            let h = st.held.pop().unwrap();
            out.push((h.from, h.data));
        }
    }

    /// When the next held datagram is due.
    pub fn next_release(&self) -> Option<Instant> {
        self.st.lock().unwrap().held.peek().map(|h| h.at)
    }
}

fn next(s: &mut u64) -> u64 {
    // splitmix64
    *s = s.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn chance(s: &mut u64, p: f64) -> bool {
    p > 0.0 && ((next(s) >> 11) as f64 / (1u64 << 53) as f64) < p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_apply() {
        let c: FaultConfig = "loss=0.5,dup=0.1,corrupt=0,reorder=0.2,delay_us=100,seed=3".parse().unwrap();
        assert_eq!((c.loss, c.duplicate, c.delay), (0.5, 0.1, Duration::from_micros(100)));
        assert!("loss=2".parse::<FaultConfig>().is_err());
        assert!("lost=0.1".parse::<FaultConfig>().is_err());
        let f = FaultLayer::new(c);
        let now = Instant::now();
        let mut out = Vec::new();
        let from: SocketAddr = "127.0.0.1:4791".parse().unwrap();
        for _ in 0..10_000 {
            f.receive(now, from, &[1, 2, 3], &mut out);
        }
        f.release(now + Duration::from_millis(1), &mut out);
        let s = f.stats();
        assert!((4000..6000).contains(&s.lost), "{s:?}");
        assert_eq!(out.len() as u64, s.seen - s.lost + s.duplicated);
        assert!(f.next_release().is_none());
    }
}
