//! Why a key is queued: the [`Trigger`] a reconcile's log names, and the [`Hint`] a watch
//! event gives it, merged when one reconcile serves several.

use std::fmt;

/// What a watch event tells reconcile beyond the key, as the queue keeps it.
pub trait Hint: Clone {
    /// What this hint and a `later` one of the same key tell one reconcile together: `None`
    /// (look at everything) unless one says all it needs of both.
    fn and(&self, later: &Self) -> Option<Self>;
}

/// Why a key was queued, logged with the reconcile it causes; `H` is a watch event's hint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger<H> {
    /// A watch event: resource short name, event type, the object's resourceVersion (0 where
    /// the server's was not a number), and what the event said that reconcile may use.
    Watch {
        resource: &'static str,
        event: &'static str,
        rv: u64,
        hint: Option<H>,
    },
    /// A (re)list enqueued every known key.
    Relist { resource: &'static str },
    /// A one-off scan outside the watch found the key (`immortal::sweep`).
    Sweep { resource: &'static str },
    /// Requeued after a failed reconcile.
    Retry,
    /// Requeued on purpose after a delay the reconcile asked for.
    Scheduled,
}

impl<H: fmt::Display> fmt::Display for Trigger<H> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Trigger::Watch {
                resource,
                event,
                rv,
                hint,
            } => {
                write!(f, "{resource} {event} rv={rv}")?;
                hint.as_ref().map_or(Ok(()), |h| write!(f, " {h}"))
            }
            Trigger::Relist { resource } => write!(f, "{resource} relist"),
            Trigger::Sweep { resource } => write!(f, "{resource} sweep"),
            Trigger::Retry => f.write_str("retry after error"),
            Trigger::Scheduled => f.write_str("scheduled requeue"),
        }
    }
}

impl<H: Hint> Trigger<H> {
    /// This trigger followed by `later`, both waiting for one reconcile: two hints combine
    /// ([`Hint::and`]); a trigger without one asks for a look at everything and stays, so that
    /// the log says why it looked; a scheduled look adds nothing to a hinted watch event.
    pub(super) fn then(self, later: Trigger<H>) -> Trigger<H> {
        match (self, later) {
            (earlier @ Trigger::Watch { hint: Some(_), .. }, Trigger::Scheduled) => earlier,
            (
                Trigger::Watch { hint: Some(a), .. },
                Trigger::Watch {
                    resource,
                    event,
                    rv,
                    hint: Some(b),
                },
            ) => Trigger::Watch {
                resource,
                event,
                rv,
                hint: a.and(&b),
            },
            (Trigger::Watch { hint: Some(_), .. }, later) => later,
            (earlier, Trigger::Watch { hint: Some(_), .. }) => earlier,
            (_, later) => later,
        }
    }
}
