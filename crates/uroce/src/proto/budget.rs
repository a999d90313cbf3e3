//! How often the agent answers a peer it has no record for (a REJ to an
//! unknown or refused REQ, a DREP to an unknown DREQ, a refusing SIDR_REP):
//! a token bucket, so that a flood of requests with a forged source address
//! does not turn the device into a reflector. The kernel answers every one
//! (`k/cm.c` `cm_issue_rej`, `cm_issue_drep`); a peer that retries gets its
//! answer once the flood is over, and a REQ that finds a listener is never
//! subject to it.

use std::time::Instant;

/// Answers allowed per second, on average.
pub const ANSWER_RATE: u32 = 200;
/// Answers allowed in a burst.
pub const ANSWER_BURST: u32 = 200;

#[derive(Debug, Clone)]
pub struct AnswerBudget {
    tokens: u32,
    /// When `tokens` was last refilled.
    since: Option<Instant>,
}

impl Default for AnswerBudget {
    fn default() -> Self {
        AnswerBudget { tokens: ANSWER_BURST, since: None }
    }
}

impl AnswerBudget {
    /// Takes a token if one is left at `now`.
    pub fn take(&mut self, now: Instant) -> bool {
        let since = *self.since.get_or_insert(now);
        let earned = now.saturating_duration_since(since).as_millis() as u64 * u64::from(ANSWER_RATE) / 1000;
        if earned > 0 {
            self.tokens = (u64::from(self.tokens) + earned).min(u64::from(ANSWER_BURST)) as u32;
            self.since = Some(now);
        }
        if self.tokens == 0 {
            return false;
        }
        self.tokens -= 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_burst_then_the_rate() {
        let mut b = AnswerBudget::default();
        let t = Instant::now();
        assert_eq!((0..1000).filter(|_| b.take(t)).count(), ANSWER_BURST as usize);
        let t1 = t + Duration::from_millis(100);
        assert_eq!((0..1000).filter(|_| b.take(t1)).count(), (ANSWER_RATE / 10) as usize);
        let t2 = t1 + Duration::from_secs(3600);
        assert_eq!((0..1000).filter(|_| b.take(t2)).count(), ANSWER_BURST as usize, "capped at a burst");
    }
}
