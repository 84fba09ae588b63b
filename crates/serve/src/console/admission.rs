//! Which connections the console keeps, decided without I/O.
//!
//! The console listens on loopback, where every local user can connect.
//! Its places for connections are few (each may hold a long poll), so they
//! must not be something another user can take: a connection that has
//! not yet shown the token must never keep one the owner needs. Hence two
//! kinds of place:
//!
//! - **pending**: every connection starts here, at most `max_pending` of
//!   them. When a new connection arrives and they are all taken, the
//!   oldest pending connection is closed to make room: holding connections
//!   (idle, or sending a head one byte at a time) buys an attacker nothing,
//!   since each newcomer pushes out the oldest, and the owner's client,
//!   which sends its request as soon as it is connected, is the newest.
//!   The driver also closes a pending connection [`PENDING_TIME`](super::PENDING_TIME)
//!   after it was accepted, and after its first answer unless it was
//!   promoted.
//! - **owner**: a connection whose request carried the token (bearer,
//!   cookie, or the body of `/login`) moves here, at most `max_owners` of
//!   them, kept alive between requests. Only the token opens this pool,
//!   so nobody without it can fill it; pending connections never count
//!   against it.
//!
//! A refused connection is never queued or kept: it gets its answer and
//! is closed.

use std::collections::{HashSet, VecDeque};

/// Connection ids are handed out in order; an id is never reused.
pub type Id = u64;

/// What [`Admission::promote`] decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Promote {
    /// The connection holds an owner place (now, or already did).
    Owner,
    /// Every owner place is taken: the request is answered 503 and the
    /// connection closed.
    Full,
    /// The connection was pushed out or ended meanwhile.
    Gone,
}

/// The places, pending and owner.
#[derive(Debug)]
pub struct Admission {
    next: Id,
    /// Pending connections, oldest first.
    pending: VecDeque<Id>,
    owners: HashSet<Id>,
    max_pending: usize,
    max_owners: usize,
}

impl Admission {
    pub fn new(max_pending: usize, max_owners: usize) -> Admission {
        Admission {
            next: 0,
            pending: VecDeque::new(),
            owners: HashSet::new(),
            max_pending: max_pending.max(1),
            max_owners,
        }
    }

    /// A connection was accepted: its id, and the pending connection it
    /// pushes out (the oldest) when every pending place was taken.
    pub fn accept(&mut self) -> (Id, Option<Id>) {
        let id = self.next;
        self.next += 1;
        let out = if self.pending.len() >= self.max_pending {
            self.pending.pop_front()
        } else {
            None
        };
        self.pending.push_back(id);
        (id, out)
    }

    /// Connection `id` presented the token.
    pub fn promote(&mut self, id: Id) -> Promote {
        if self.owners.contains(&id) {
            return Promote::Owner;
        }
        let Some(at) = self.pending.iter().position(|p| *p == id) else {
            return Promote::Gone;
        };
        if self.owners.len() >= self.max_owners {
            return Promote::Full;
        }
        self.pending.remove(at);
        self.owners.insert(id);
        Promote::Owner
    }

    /// Whether `id` holds an owner place (its connection is kept alive).
    pub fn is_owner(&self, id: Id) -> bool {
        self.owners.contains(&id)
    }

    /// A pending connection's time is up: `true` when it must be closed
    /// (it was not promoted), and then its place is free.
    pub fn expire(&mut self, id: Id) -> bool {
        if self.owners.contains(&id) {
            return false;
        }
        self.pending.retain(|p| *p != id);
        true
    }

    /// Connection `id` ended: its place, whichever, is free.
    pub fn close(&mut self, id: Id) {
        self.pending.retain(|p| *p != id);
        self.owners.remove(&id);
    }

    /// How many pending and owner connections there are.
    #[cfg(test)]
    pub fn counts(&self) -> (usize, usize) {
        (self.pending.len(), self.owners.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newcomer_pushes_out_the_oldest_pending_connection() {
        let mut a = Admission::new(2, 4);
        let (x, none) = a.accept();
        assert_eq!(none, None);
        let (y, none) = a.accept();
        assert_eq!(none, None);
        let (z, out) = a.accept();
        assert_eq!(out, Some(x), "the oldest goes");
        assert_eq!(a.counts(), (2, 0));
        assert_eq!(a.promote(x), Promote::Gone, "pushed out is pushed out");
        assert_eq!(a.promote(z), Promote::Owner);
        let (_, out) = a.accept();
        assert_eq!(out, None, "z's pending place was freed by its promotion");
        let (_, out) = a.accept();
        assert_eq!(out, Some(y));
    }

    #[test]
    fn owners_are_never_pushed_out_by_pending_connections() {
        let mut a = Admission::new(1, 2);
        let (owner, _) = a.accept();
        assert_eq!(a.promote(owner), Promote::Owner);
        for _ in 0..1000 {
            let (_, out) = a.accept();
            assert_ne!(out, Some(owner));
        }
        assert!(a.is_owner(owner));
        assert!(!a.expire(owner), "an owner has no pending deadline");
        assert_eq!(a.promote(owner), Promote::Owner, "promoting twice is fine");
    }

    #[test]
    fn owner_places_are_capped_and_freed_on_close() {
        let mut a = Admission::new(8, 1);
        let (o1, _) = a.accept();
        let (o2, _) = a.accept();
        assert_eq!(a.promote(o1), Promote::Owner);
        assert_eq!(a.promote(o2), Promote::Full);
        assert!(!a.is_owner(o2));
        a.close(o1);
        assert_eq!(a.promote(o2), Promote::Owner);
        assert_eq!(a.counts(), (0, 1));
    }

    #[test]
    fn an_expired_pending_connection_frees_its_place() {
        let mut a = Admission::new(1, 1);
        let (p, _) = a.accept();
        assert!(a.expire(p));
        assert_eq!(a.counts(), (0, 0));
        assert_eq!(a.promote(p), Promote::Gone);
        a.close(p);
        assert_eq!(a.counts(), (0, 0));
    }
}
