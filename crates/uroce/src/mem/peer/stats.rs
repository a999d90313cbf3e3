//! One peer-memory client's counters ([`PeerStats`]): the seed's
//! `/sys/kernel/mm/memory_peers/<client>/` files, their arithmetic, and
//! their text form.

/// A snapshot of one client's counters.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeerStats {
    /// The client's name (its counters' directory).
    pub name: String,
    /// The client's version string.
    pub version: String,
    /// Regions mapped on the peer.
    pub num_alloc_mrs: u64,
    /// Regions whose mapping ended (deregistration or invalidation).
    pub num_dealloc_mrs: u64,
    /// Pages mapped, in the client's page size.
    pub num_reg_pages: u64,
    /// Pages of the mappings that ended.
    pub num_dereg_pages: u64,
    /// Bytes mapped (region lengths).
    pub num_reg_bytes: u64,
    /// Bytes of the mappings that ended.
    pub num_dereg_bytes: u64,
    /// Calls of the invalidate callback ([`Invalidator::invalidate`](super::Invalidator::invalidate)).
    pub num_free_callbacks: u64,
}

/// Counter file names in OFED's order (after `version`).
pub const COUNTERS: [&str; 7] = [
    "num_alloc_mrs",
    "num_dealloc_mrs",
    "num_reg_pages",
    "num_dereg_pages",
    "num_reg_bytes",
    "num_dereg_bytes",
    "num_free_callbacks",
];

impl PeerStats {
    /// The counters with their file names, in [`COUNTERS`] order.
    pub fn counters(&self) -> [(&'static str, u64); 7] {
        [
            (COUNTERS[0], self.num_alloc_mrs),
            (COUNTERS[1], self.num_dealloc_mrs),
            (COUNTERS[2], self.num_reg_pages),
            (COUNTERS[3], self.num_dereg_pages),
            (COUNTERS[4], self.num_reg_bytes),
            (COUNTERS[5], self.num_dereg_bytes),
            (COUNTERS[6], self.num_free_callbacks),
        ]
    }

    /// Sets counter `name` (one of [`COUNTERS`]); false for another name.
    pub fn set(&mut self, name: &str, v: u64) -> bool {
        let slot = match name {
            "num_alloc_mrs" => &mut self.num_alloc_mrs,
            "num_dealloc_mrs" => &mut self.num_dealloc_mrs,
            "num_reg_pages" => &mut self.num_reg_pages,
            "num_dereg_pages" => &mut self.num_dereg_pages,
            "num_reg_bytes" => &mut self.num_reg_bytes,
            "num_dereg_bytes" => &mut self.num_dereg_bytes,
            "num_free_callbacks" => &mut self.num_free_callbacks,
            _ => return false,
        };
        *slot = v;
        true
    }

    /// Regions on the peer now: `num_alloc_mrs - num_dealloc_mrs`.
    pub fn regions(&self) -> u64 {
        self.num_alloc_mrs.saturating_sub(self.num_dealloc_mrs)
    }

    /// Device pages mapped now.
    pub fn mapped_pages(&self) -> u64 {
        self.num_reg_pages.saturating_sub(self.num_dereg_pages)
    }

    /// Bytes mapped now.
    pub fn mapped_bytes(&self) -> u64 {
        self.num_reg_bytes.saturating_sub(self.num_dereg_bytes)
    }

    /// Adds `o`'s counters to these.
    pub fn add(&mut self, o: &PeerStats) {
        self.num_alloc_mrs += o.num_alloc_mrs;
        self.num_dealloc_mrs += o.num_dealloc_mrs;
        self.num_reg_pages += o.num_reg_pages;
        self.num_dereg_pages += o.num_dereg_pages;
        self.num_reg_bytes += o.num_reg_bytes;
        self.num_dereg_bytes += o.num_dereg_bytes;
        self.num_free_callbacks += o.num_free_callbacks;
    }

    /// The counters of a process that has exited: what it still had mapped
    /// is unmapped by its exit (as the kernel releases a dead process's
    /// umems: MAPPED -> UNMAPPED), so it counts as deallocated.
    pub fn at_exit(&self) -> PeerStats {
        let mut s = self.clone();
        s.num_dealloc_mrs = s.num_dealloc_mrs.max(s.num_alloc_mrs);
        s.num_dereg_pages = s.num_dereg_pages.max(s.num_reg_pages);
        s.num_dereg_bytes = s.num_dereg_bytes.max(s.num_reg_bytes);
        s
    }

    /// The one-file form published beside the sysfs-like files: every
    /// counter of one moment, `name value` per line.
    pub fn to_text(&self) -> String {
        let mut t = format!("version {}\n", self.version);
        for (n, v) in self.counters() {
            t.push_str(&format!("{n} {v}\n"));
        }
        t
    }

    /// Parses [`PeerStats::to_text`]; unknown lines are ignored.
    pub fn from_text(name: &str, t: &str) -> PeerStats {
        let mut s = PeerStats { name: name.to_string(), ..Default::default() };
        for line in t.lines() {
            let Some((k, v)) = line.split_once(' ') else { continue };
            if k == "version" {
                s.version = v.trim().to_string();
            } else if let Ok(v) = v.trim().parse() {
                s.set(k, v);
            }
        }
        s
    }
}
