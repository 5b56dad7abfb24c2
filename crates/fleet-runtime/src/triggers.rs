//! The change signals that wake a reconciler between passes.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use tokio::sync::watch;

/// One change signal, whatever the type of value it carries.
trait Signal: Send {
    /// Returns once the signal moved since it was last seen; never once its sender is gone.
    fn changed(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>>;
    /// Whether it moved since it was last seen (never once its sender is gone).
    fn has_moved(&self) -> bool;
    fn mark_seen(&mut self);
}

impl<T: Send + Sync> Signal for watch::Receiver<T> {
    fn changed(&mut self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            // A signal whose sender is gone never moves again: it must not wake the loop
            // over and over.
            if watch::Receiver::changed(self).await.is_err() {
                std::future::pending::<()>().await;
            }
        })
    }

    fn has_moved(&self) -> bool {
        self.has_changed().unwrap_or(false)
    }

    fn mark_seen(&mut self) {
        self.mark_unchanged();
    }
}

/// Names one signal of a [`Triggers`], for a pass that marks it seen itself.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TriggerId(usize);

/// The change signals a reconciler wakes on. When several moved, the first added is taken
/// first: a run is the same every time (the simulation replays a seed bit for bit).
#[derive(Default)]
pub struct Triggers {
    signals: Vec<Box<dyn Signal>>,
    /// The signals that wake nothing for now ([`Triggers::set_waking`]), by position.
    asleep: Vec<bool>,
    /// The signal whose move [`Triggers::changed`] last returned on (which marks it seen).
    woken_by: Option<usize>,
    /// Which signals had moved when they were last all marked seen: what the pass that
    /// follows was woken by.
    moved: Vec<bool>,
}

impl Triggers {
    /// No signal: only the moment a pass asks for wakes the loop.
    pub fn none() -> Self {
        Self::default()
    }

    /// Adds `signal`; its current value counts as seen only once marked.
    pub fn add<T: Send + Sync + 'static>(&mut self, signal: watch::Receiver<T>) -> TriggerId {
        self.signals.push(Box::new(signal));
        self.asleep.push(false);
        self.moved.push(false);
        TriggerId(self.signals.len() - 1)
    }

    /// Whether signal `id` wakes the loop (it does once added). One that does not is still
    /// marked seen with the others, so a move during a pass wakes the next as soon as the
    /// pass lets it wake again.
    pub fn set_waking(&mut self, id: TriggerId, waking: bool) {
        if let Some(asleep) = self.asleep.get_mut(id.0) {
            *asleep = !waking;
        }
    }

    /// As [`Triggers::add`], for building.
    pub fn with<T: Send + Sync + 'static>(mut self, signal: watch::Receiver<T>) -> Self {
        self.add(signal);
        self
    }

    /// Returns once any signal moved since it was last marked seen; never without one.
    pub async fn changed(&mut self) {
        let mut waits: Vec<_> = self
            .signals
            .iter_mut()
            .zip(&self.asleep)
            .enumerate()
            .filter(|(_, (_, asleep))| !**asleep)
            .map(|(index, (signal, _))| (index, signal.changed()))
            .collect();
        let woken_by = std::future::poll_fn(|context| {
            for (index, wait) in &mut waits {
                if wait.as_mut().poll(context).is_ready() {
                    return Poll::Ready(*index);
                }
            }
            Poll::Pending
        })
        .await;
        drop(waits);
        self.woken_by = Some(woken_by);
    }

    /// Marks every signal seen: what moved so far is what the next pass will look at.
    pub fn mark_seen(&mut self) {
        let woken_by = self.woken_by.take();
        for (index, (signal, moved)) in self.signals.iter_mut().zip(&mut self.moved).enumerate() {
            *moved = woken_by == Some(index) || signal.has_moved();
            signal.mark_seen();
        }
    }

    /// Whether signal `id` alone had moved when every signal was last marked seen: the pass
    /// that follows was woken by it and by nothing else (not by its timer either).
    pub fn moved_alone(&self, id: TriggerId) -> bool {
        self.moved.iter().enumerate().all(|(index, moved)| *moved == (index == id.0))
    }

    /// Marks one signal seen, for a pass that has just looked at what it signals.
    pub fn mark_one_seen(&mut self, id: TriggerId) {
        if let Some(signal) = self.signals.get_mut(id.0) {
            signal.mark_seen();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn any_signal_wakes_and_a_seen_one_does_not_again() {
        let (first, first_watch) = watch::channel(0u64);
        let (second, second_watch) = watch::channel(false);
        let mut triggers = Triggers::none().with(first_watch).with(second_watch);
        second.send_replace(true);
        tokio::time::timeout(Duration::from_secs(1), triggers.changed()).await.expect("woken by the second");
        triggers.mark_seen();
        assert!(tokio::time::timeout(Duration::from_secs(1), triggers.changed()).await.is_err(), "nothing moved");
        first.send_replace(1);
        tokio::time::timeout(Duration::from_secs(1), triggers.changed()).await.expect("woken by the first");
    }

    #[tokio::test(start_paused = true)]
    async fn a_pass_knows_whether_one_signal_alone_woke_it() {
        let (first, first_watch) = watch::channel(0u64);
        let (second, second_watch) = watch::channel(0u64);
        let mut triggers = Triggers::none();
        let (first_id, second_id) = (triggers.add(first_watch), triggers.add(second_watch));
        triggers.mark_seen();
        assert!(!triggers.moved_alone(first_id) && !triggers.moved_alone(second_id), "nothing moved: the timer");
        second.send_replace(1);
        triggers.mark_seen();
        assert!(triggers.moved_alone(second_id) && !triggers.moved_alone(first_id));
        second.send_replace(2);
        tokio::time::timeout(Duration::from_secs(1), triggers.changed()).await.expect("woken by the second");
        triggers.mark_seen();
        assert!(triggers.moved_alone(second_id), "the move that woke the loop, though waking marked it seen");
        first.send_replace(1);
        second.send_replace(2);
        triggers.mark_seen();
        assert!(!triggers.moved_alone(first_id) && !triggers.moved_alone(second_id), "both moved");
        triggers.mark_seen();
        assert!(!triggers.moved_alone(second_id), "seen since");
    }

    #[tokio::test(start_paused = true)]
    async fn a_signal_whose_sender_is_gone_never_wakes() {
        let (sender, receiver) = watch::channel(0u64);
        let mut triggers = Triggers::none().with(receiver);
        drop(sender);
        assert!(tokio::time::timeout(Duration::from_secs(60), triggers.changed()).await.is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn one_signal_can_be_marked_seen_alone() {
        let (first, first_watch) = watch::channel(0u64);
        let (second, second_watch) = watch::channel(0u64);
        let mut triggers = Triggers::none();
        let id = triggers.add(first_watch);
        triggers.add(second_watch);
        first.send_replace(1);
        triggers.mark_one_seen(id);
        assert!(tokio::time::timeout(Duration::from_secs(1), triggers.changed()).await.is_err(), "seen already");
        second.send_replace(1);
        tokio::time::timeout(Duration::from_secs(1), triggers.changed()).await.expect("the other one still wakes");
    }

    #[tokio::test(start_paused = true)]
    async fn a_signal_that_does_not_wake_keeps_its_move_for_when_it_does() {
        let (sender, receiver) = watch::channel(0u64);
        let mut triggers = Triggers::none();
        let id = triggers.add(receiver);
        triggers.set_waking(id, false);
        sender.send_replace(1);
        let woke = tokio::time::timeout(Duration::from_secs(60), triggers.changed()).await;
        assert!(woke.is_err(), "a signal that does not wake woke the loop");
        triggers.set_waking(id, true);
        tokio::time::timeout(Duration::from_secs(1), triggers.changed())
            .await
            .expect("the move made while it did not wake wakes it now");
    }
}
