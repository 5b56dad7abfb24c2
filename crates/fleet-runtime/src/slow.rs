//! A wait that says when it runs long: a future awaited to its end, with a word each time it
//! has run for a first span, then twice, four times as long… A wait on something that never
//! answers would otherwise be silent while the rest of fleetd looks well.

use std::future::Future;
use std::time::Duration;

/// Runs `work` to its end; calls `late` with how long it has run each time that reaches
/// `first` doubled (`first`, `2 × first`, `4 × first`…).
pub async fn telling_when_late<T>(first: Duration, work: impl Future<Output = T>, mut late: impl FnMut(Duration)) -> T {
    let started = tokio::time::Instant::now();
    let mut work = std::pin::pin!(work);
    let mut tell_after = first;
    loop {
        tokio::select! {
            biased;
            outcome = &mut work => return outcome,
            () = tokio::time::sleep_until(started + tell_after) => {
                late(tell_after);
                tell_after *= 2;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_wait_is_told_late_at_doubling_spans_until_it_ends() {
        let mut told = Vec::new();
        let first = Duration::from_secs(10);
        let answer =
            telling_when_late(first, tokio::time::sleep(Duration::from_secs(75)), |waited| told.push(waited)).await;
        assert_eq!(answer, ());
        assert_eq!(told, [first, first * 2, first * 4], "at 10, 20 and 40 s; the next would be at 80");
        let mut quick = Vec::new();
        let seven = telling_when_late(first, async { 7 }, |waited| quick.push(waited)).await;
        assert_eq!((seven, quick.len()), (7, 0), "a wait that ends in time is never told");
    }
}
