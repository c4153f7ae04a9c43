//! Every deadline of one operation, in one table indexed by what is waited for (the pattern
//! of quinn-proto's `TimerTable`).

use crate::time::Instant;

/// What a deadline is for. Each wait has its own entry, so one never hides another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Timer {
    /// Hub: every other rank owes `Ready` (the first missing one is blamed).
    Ready,
    /// Leaf: the hub owes `Go`.
    Go,
    /// The fast path is over: fetch what is missing.
    Cutoff,
    /// The ring predecessor owes an answer (`FetchAck` or `FetchNack`) to our `Fetch`.
    Fetch,
    /// Reads from the ring predecessor are in flight.
    Reads,
    /// The ring successor owes `Fin`.
    Fin,
    /// Tell our successor we are still recovering for it.
    Keepalive,
    /// A block's fast path on a lane is overdue (Allgather): settle what it has.
    Blocks,
    /// Root: look whether the transport still completes our multicasts.
    Sends,
}

impl Timer {
    const COUNT: usize = 9;
    pub(crate) const ALL: [Timer; Self::COUNT] = [
        Timer::Ready,
        Timer::Go,
        Timer::Cutoff,
        Timer::Fetch,
        Timer::Reads,
        Timer::Fin,
        Timer::Keepalive,
        Timer::Blocks,
        Timer::Sends,
    ];
}

/// One optional deadline per [`Timer`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TimerTable {
    at: [Option<Instant>; Timer::COUNT],
}

impl TimerTable {
    pub(crate) fn set(&mut self, t: Timer, at: Instant) {
        self.at[t as usize] = Some(at);
    }

    pub(crate) fn get(&self, t: Timer) -> Option<Instant> {
        self.at[t as usize]
    }

    pub(crate) fn stop(&mut self, t: Timer) {
        self.at[t as usize] = None;
    }

    /// Moves an armed deadline out to at least `at`; an unarmed one stays unarmed.
    pub(crate) fn extend(&mut self, t: Timer, at: Instant) {
        if let Some(cur) = &mut self.at[t as usize] {
            *cur = (*cur).max(at);
        }
    }

    /// Whether `t` is armed and due at `now`.
    pub(crate) fn expired(&self, t: Timer, now: Instant) -> bool {
        self.get(t).is_some_and(|at| at <= now)
    }

    /// The earliest armed deadline, `cutoff` included only when it still matters.
    pub(crate) fn next(&self, with_cutoff: bool) -> Option<Instant> {
        Timer::ALL
            .iter()
            .filter(|t| with_cutoff || **t != Timer::Cutoff)
            .filter_map(|t| self.get(*t))
            .min()
    }
}
