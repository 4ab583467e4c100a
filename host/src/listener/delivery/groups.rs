//! The group gate: on a FIFO queue, a group's messages are handled one at a time, in the
//! order they reached this host, across its tasks. A message whose group is busy waits
//! (holding no handler slot) until the one before it settles. If that one was deleted
//! (handled, or poisoned), the next goes on; if it is to come back (a retry delay, a release,
//! a lost lease), those waiting behind it are released unhandled, since handling them would
//! overtake it. SQS then gives the group out again from that message on: a FIFO receive
//! returns none of a group's later messages while one of its messages is in flight.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::oneshot;

use crate::queue::MessageId;

/// The groups that have a message being handled here, each with the messages waiting behind it.
#[derive(Default)]
pub(in crate::listener) struct GroupGate {
    groups: Mutex<Groups>,
}

#[derive(Default)]
struct Groups {
    by_name: HashMap<String, Group>,
    /// The group of each message whose turn it is.
    holders: HashMap<MessageId, String>,
}

struct Group {
    /// Whether the message whose turn it is was deleted.
    gone: bool,
    waiting: VecDeque<(MessageId, oneshot::Sender<Verdict>)>,
}

/// What a waiting message is told.
pub(in crate::listener) enum Verdict {
    /// Its turn: the message before it was deleted.
    Go(Turn),
    /// The message before it is to come back: release this one unhandled.
    Released,
}

/// How a message enters the gate.
pub(in crate::listener) enum Entry {
    /// Its group was idle: its turn now.
    Now(Turn),
    /// Its group is busy: its turn, or its release, comes later.
    Wait(oneshot::Receiver<Verdict>),
}

/// A message's turn in its group; its end (the drop, once the message settled) lets the
/// next one go, or releases those waiting.
pub(in crate::listener) struct Turn {
    gate: Arc<GroupGate>,
    id: MessageId,
}

impl GroupGate {
    fn groups(&self) -> std::sync::MutexGuard<'_, Groups> {
        self.groups.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Message `id` of `group` arrives. Call it in the order the messages came: a group's
    /// turns follow it.
    pub(in crate::listener) fn enter(self: &Arc<Self>, group: &str, id: &MessageId) -> Entry {
        let mut groups = self.groups();
        match groups.by_name.get_mut(group) {
            Some(busy) => {
                let (tell, told) = oneshot::channel();
                busy.waiting.push_back((id.clone(), tell));
                Entry::Wait(told)
            }
            None => {
                groups.by_name.insert(group.to_string(), Group { gone: false, waiting: VecDeque::new() });
                groups.holders.insert(id.clone(), group.to_string());
                Entry::Now(Turn { gate: self.clone(), id: id.clone() })
            }
        }
    }

    /// Message `id` was deleted (handled or poisoned): when its turn ends, the next goes on.
    /// Nothing for a message that holds no turn.
    pub(in crate::listener) fn deleted(&self, id: &MessageId) {
        let mut groups = self.groups();
        let Some(name) = groups.holders.get(id).cloned() else { return };
        if let Some(group) = groups.by_name.get_mut(&name) {
            group.gone = true;
        }
    }

    /// The turn of `id` ended: the next message's turn, or every waiting one released.
    fn leave(self: &Arc<Self>, id: &MessageId) {
        let told = {
            let mut groups = self.groups();
            let Some(name) = groups.holders.remove(id) else { return };
            let Some(group) = groups.by_name.get_mut(&name) else { return };
            if group.gone {
                match group.waiting.pop_front() {
                    Some((next, tell)) => {
                        group.gone = false;
                        groups.holders.insert(next.clone(), name);
                        vec![(tell, Verdict::Go(Turn { gate: self.clone(), id: next }))]
                    }
                    None => {
                        groups.by_name.remove(&name);
                        Vec::new()
                    }
                }
            } else {
                let group = groups.by_name.remove(&name).expect("looked up above");
                group.waiting.into_iter().map(|(_, tell)| (tell, Verdict::Released)).collect()
            }
        };
        // Outside the lock: a turn whose waiter is gone (shut down) comes back and ends here.
        for (tell, verdict) in told {
            let _ = tell.send(verdict);
        }
    }

    /// How many groups have a message being handled (for tests).
    #[cfg(test)]
    fn busy(&self) -> usize {
        self.groups().by_name.len()
    }
}

impl Drop for Turn {
    fn drop(&mut self) {
        self.gate.leave(&self.id);
    }
}

/// What a waiting message learns: its turn, or its release (also when the gate went away).
pub(in crate::listener) async fn wait(told: oneshot::Receiver<Verdict>) -> Verdict {
    told.await.unwrap_or(Verdict::Released)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now(entry: Entry) -> Turn {
        match entry {
            Entry::Now(turn) => turn,
            Entry::Wait(_) => panic!("expected its turn now"),
        }
    }

    fn waiting(entry: Entry) -> oneshot::Receiver<Verdict> {
        match entry {
            Entry::Wait(told) => told,
            Entry::Now(_) => panic!("expected it to wait"),
        }
    }

    #[tokio::test]
    async fn a_groups_messages_take_turns_in_order_and_other_groups_go_at_once() {
        let gate = Arc::new(GroupGate::default());
        let first = now(gate.enter("a", &"1".into()));
        let second = waiting(gate.enter("a", &"2".into()));
        let third = waiting(gate.enter("a", &"3".into()));
        let other = now(gate.enter("b", &"4".into()));
        gate.deleted(&"1".into());
        drop(first);
        let Verdict::Go(second) = wait(second).await else { panic!("the second's turn after the first was deleted") };
        gate.deleted(&"2".into());
        drop(second);
        let Verdict::Go(third) = wait(third).await else { panic!("the third's turn after the second") };
        gate.deleted(&"3".into());
        drop(third);
        drop(other);
        assert_eq!(gate.busy(), 0, "no group is left behind");
    }

    #[tokio::test]
    async fn those_behind_a_message_that_comes_back_are_released_unhandled() {
        let gate = Arc::new(GroupGate::default());
        let first = now(gate.enter("a", &"1".into()));
        let second = waiting(gate.enter("a", &"2".into()));
        let third = waiting(gate.enter("a", &"3".into()));
        drop(first);
        assert!(matches!(wait(second).await, Verdict::Released));
        assert!(matches!(wait(third).await, Verdict::Released));
        assert_eq!(gate.busy(), 0);
        let _again = now(gate.enter("a", &"1".into()));
    }

    #[tokio::test]
    async fn a_waiter_that_went_away_counts_as_released() {
        let gate = Arc::new(GroupGate::default());
        let first = now(gate.enter("a", &"1".into()));
        drop(waiting(gate.enter("a", &"2".into())));
        let third = waiting(gate.enter("a", &"3".into()));
        gate.deleted(&"1".into());
        drop(first);
        assert!(matches!(wait(third).await, Verdict::Released), "the third must not overtake the second, which comes back");
        assert_eq!(gate.busy(), 0);
    }
}
