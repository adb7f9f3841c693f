//! The tick counter behind event timestamps (FORMAT.md 4.1): the TSC on x86-64, `CLOCK_MONOTONIC`
//! nanoseconds elsewhere.

use ocular_format::Clock;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The clock this build records with.
pub const CLOCK: Clock = if cfg!(target_arch = "x86_64") { Clock::Tsc } else { Clock::MonotonicNs };

/// Reads the tick counter. On x86-64 this is `rdtsc`: no serialization, so it can be reordered by a few
/// instructions, far below the cost of one Python event.
#[inline(always)]
pub fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: rdtsc has no preconditions on x86-64; it only reads the time stamp counter.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        monotonic_ns()
    }
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock `time.monotonic_ns()` reads, so users can line events up
/// with their own timestamps.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec to a valid pointer; CLOCK_MONOTONIC always exists on Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    debug_assert_eq!(rc, 0);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Wall clock, nanoseconds since the Unix epoch.
pub fn unix_ns() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0)
}

/// The three clocks read together.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ClockPoint {
    /// Tick counter.
    pub ticks: u64,
    /// Monotonic ns.
    pub monotonic_ns: u64,
    /// Wall clock ns.
    pub unix_ns: i64,
}

impl ClockPoint {
    /// Reads all three: ticks between two monotonic reads, paired with their midpoint. Of a few tries the
    /// narrowest pair is kept, so a preemption between the reads (common on a virtual machine) does not
    /// skew the point: two points 1 ms apart then give the tick rate to about 1e-4.
    pub fn now() -> Self {
        let mut best = (u64::MAX, 0, 0);
        for _ in 0..5 {
            let m0 = monotonic_ns();
            let t = ticks();
            let m1 = monotonic_ns();
            let width = m1.saturating_sub(m0);
            if width < best.0 {
                best = (width, t, m0 + width / 2);
            }
        }
        ClockPoint { ticks: best.1, monotonic_ns: best.2, unix_ns: unix_ns() }
    }
}

/// Ticks per second, measured against the monotonic clock over `window`. The TSC of every x86-64 CPU
/// of the last decade is invariant (constant rate), which this relies on; a window of 20 ms gives
/// about 5 significant digits.
pub fn ticks_per_second(window: Duration) -> f64 {
    if CLOCK == Clock::MonotonicNs {
        return 1e9;
    }
    let a = ClockPoint::now();
    std::thread::sleep(window);
    let b = ClockPoint::now();
    rate_between(&a, &b).unwrap_or(1e9)
}

/// Ticks per second between two clock points, if they are far enough apart to mean anything.
pub fn rate_between(a: &ClockPoint, b: &ClockPoint) -> Option<f64> {
    let dt = b.monotonic_ns.checked_sub(a.monotonic_ns)?;
    let dticks = b.ticks.checked_sub(a.ticks)?;
    (dt >= 1_000_000).then(|| dticks as f64 * 1e9 / dt as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_advance_at_the_calibrated_rate() {
        let hz = ticks_per_second(Duration::from_millis(20));
        assert!((1e8..1e11).contains(&hz), "implausible tick rate {hz}");
        // A second measurement agrees with the first within 2% (both against CLOCK_MONOTONIC).
        let a = ClockPoint::now();
        std::thread::sleep(Duration::from_millis(30));
        let b = ClockPoint::now();
        let again = rate_between(&a, &b).unwrap();
        assert!((again / hz - 1.0).abs() < 0.02, "{again} vs {hz}");
    }

    #[test]
    fn two_milliseconds_give_the_rate_of_twenty() {
        // What the recorder relies on instead of a sleep: the span of its calibration (about 2 ms).
        let hz = ticks_per_second(Duration::from_millis(20));
        let short = ticks_per_second(Duration::from_millis(2));
        assert!((short / hz - 1.0).abs() < 2e-3, "2 ms: {short}, 20 ms: {hz}");
    }

    #[test]
    fn monotonic_agrees_with_std() {
        let a = monotonic_ns();
        let i = std::time::Instant::now();
        std::thread::sleep(Duration::from_millis(5));
        let b = monotonic_ns();
        let d = i.elapsed().as_nanos() as u64;
        assert!(b - a >= 5_000_000 && (b - a).abs_diff(d) < 2_000_000, "{} vs {d}", b - a);
    }
}
