//! An operation's buffer, which several threads read and write at once where their ranges
//! do not meet: [`OpBuffer`].
//!
//! A rank's send workers read its block from the buffer while its receive workers write the
//! other ranks' blocks into it (an Allgather), two send workers of a Broadcast's root read
//! two halves of one block (two lanes), and the TCP read service reads while fetched chunks
//! land. Each of those holds the buffer for a whole system call: a GSO `sendmsg` (which on
//! loopback or a veth also runs the receivers' delivery), a `recvmsg` straight into the
//! buffer. Behind one lock they took turns: the 16-core host showed a second lane adding
//! nothing to a Broadcast's root, and a 4-rank Allgather's send and receive workers waiting
//! on each other.
//!
//! So the buffer is cut into stripes (64 KiB or more, at most [`MAX_STRIPES`]), each behind
//! its own reader-writer lock. A range is reached with the locks of the stripes it covers,
//! taken in ascending order: shared for [`OpBuffer::view`], exclusive for
//! [`OpBuffer::view_mut`]; the whole vector ([`OpBuffer::with`], which may resize or take
//! it) with every stripe's exclusive lock. Two accesses whose bytes overlap share a stripe,
//! so a byte is never written while another thread reads or writes it.
//!
//! This module's `unsafe` is the vector's raw parts: kept apart so that a range can be
//! handed out without a reference to the whole vector, put back together under every lock.
#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

/// The smallest stripe: 64 KiB, one GSO batch of 4 KiB chunks.
const MIN_STRIPE_SHIFT: u32 = 16;

/// The most stripes a buffer is cut into (a 64 MiB buffer has 1024 of 64 KiB; a larger one
/// has larger stripes).
pub(crate) const MAX_STRIPES: usize = 1024;

/// A vector taken apart: what `Vec::from_raw_parts` needs.
struct Parts {
    ptr: *mut u8,
    len: usize,
    cap: usize,
}

impl Parts {
    fn of(v: Vec<u8>) -> Self {
        let mut v = ManuallyDrop::new(v);
        Parts {
            ptr: v.as_mut_ptr(),
            len: v.len(),
            cap: v.capacity(),
        }
    }
}

struct Inner {
    /// Stripe `i` covers bytes `i << shift ..` up to the next stripe; the last one every
    /// byte beyond (after a [`OpBuffer::with`] that grew the vector).
    shift: u32,
    stripes: Box<[RwLock<()>]>,
    /// Changed only under every stripe's exclusive lock; read under at least one stripe's.
    parts: UnsafeCell<Parts>,
    /// The vector's length as `with` last left it, for [`OpBuffer::len`] without a lock (a
    /// send worker asks before every batch, and stripe 0's lock may be held by a receive).
    len: AtomicUsize,
}

// Why `Inner` may be sent and shared: it owns the vector its parts describe (a `Vec<u8>` is
// `Send` and `Sync`). Its header (`parts`) is written only by `with`, which holds every
// stripe's exclusive lock, and read only by holders of at least one stripe's lock, so no read
// meets a write. Its bytes are reached only through `view` (shared locks of every stripe the
// range covers) and `view_mut` (exclusive locks of the same) or `with` (every exclusive
// lock): two threads that reach a common byte hold a common stripe's lock, so a byte is
// written by one thread at a time and never while another reads it.
// SAFETY: by the argument just above.
unsafe impl Send for Inner {}
// SAFETY: as for `Send`.
unsafe impl Sync for Inner {}

// A panic while a range or the whole is held leaves the parts whole (`with` puts them back
// as it unwinds) and, at worst, bytes half written, as the lock this replaced did (its
// poisoning was ignored too).
impl std::panic::RefUnwindSafe for Inner {}

impl Drop for Inner {
    fn drop(&mut self) {
        let p = self.parts.get_mut();
        // SAFETY: the parts came from a `Vec<u8>` taken apart (`Parts::of`) and are not used
        // after this; `&mut self` means no other access is left.
        drop(unsafe { Vec::from_raw_parts(p.ptr, p.len, p.cap) });
    }
}

impl Inner {
    /// The stripes a range of `len` bytes at `offset` covers, first and last (at least one,
    /// clamped to those there are).
    fn span(&self, offset: u64, len: u64) -> (usize, usize) {
        let last_stripe = self.stripes.len() - 1;
        let stripe =
            |b: u64| usize::try_from(b >> self.shift).map_or(last_stripe, |s| s.min(last_stripe));
        let end = offset.saturating_add(len.max(1) - 1);
        (stripe(offset), stripe(end))
    }

    /// Takes the locks of the stripes a range of `len` bytes at `offset` covers (each by
    /// `lock`, in ascending order), and finds where the range starts in the vector: `None`
    /// (the locks taken all the same) when it does not lie in it.
    fn locate<'a, G>(
        &'a self,
        offset: u64,
        len: u64,
        lock: impl Fn(&'a RwLock<()>) -> G,
    ) -> (Held<G>, Option<*mut u8>) {
        let (first, last) = self.span(offset, len);
        let held = Held::each(&self.stripes[first..=last], lock);
        // SAFETY: a stripe's lock is held, so `with` is not changing the parts.
        let p = unsafe { &*self.parts.get() };
        let at = range(offset, len, p.len).map(|r| p.ptr.wrapping_add(r.start));
        (held, at)
    }
}

/// Locks held on a range's stripes, released when dropped (one or two without allocating: a
/// chunk, a batch across a stripe's end).
enum Held<G> {
    One(#[allow(dead_code)] G),
    Two(#[allow(dead_code)] G, #[allow(dead_code)] G),
    Many(#[allow(dead_code)] Vec<G>),
}

impl<G> Held<G> {
    /// Each of `stripes`, in order, by `lock`.
    fn each<'a>(stripes: &'a [RwLock<()>], lock: impl Fn(&'a RwLock<()>) -> G) -> Self {
        match stripes {
            [a] => Held::One(lock(a)),
            [a, b] => Held::Two(lock(a), lock(b)),
            _ => Held::Many(stripes.iter().map(lock).collect()),
        }
    }
}

/// An operation's buffer, shared by the caller and the port: the receive halves write chunks
/// into it, the send halves and the read service read from it, reads write into it. Threads
/// reach disjoint ranges at once (see the module's notes).
#[derive(Clone)]
pub struct OpBuffer(Arc<Inner>);

impl fmt::Debug for OpBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never waits: a thread that holds the whole buffer may print it.
        let len = self.len();
        f.debug_struct("OpBuffer")
            .field("len", &len)
            .field("stripes", &self.0.stripes.len())
            .finish()
    }
}

impl Default for OpBuffer {
    fn default() -> Self {
        Self::from_vec(Vec::new())
    }
}

impl OpBuffer {
    /// A zeroed buffer of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        Self::from_vec(vec![0; len])
    }

    /// A buffer holding `v` (not copied).
    pub fn from_vec(v: Vec<u8>) -> Self {
        let len = v.len() as u64;
        let mut shift = MIN_STRIPE_SHIFT;
        while len.div_ceil(1 << shift) > MAX_STRIPES as u64 {
            shift += 1;
        }
        let count = usize::try_from(len.div_ceil(1 << shift))
            .map_or(MAX_STRIPES, |c| c.clamp(1, MAX_STRIPES));
        OpBuffer(Arc::new(Inner {
            shift,
            stripes: (0..count).map(|_| RwLock::new(())).collect(),
            len: AtomicUsize::new(v.len()),
            parts: UnsafeCell::new(Parts::of(v)),
        }))
    }

    /// Runs `f` on the whole vector, which it may also resize or take, while no other thread
    /// reaches any of it.
    pub fn with<R>(&self, f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        let _locks: Vec<_> = self
            .0
            .stripes
            .iter()
            .map(|s| s.write().unwrap_or_else(PoisonError::into_inner))
            .collect();
        /// Puts the vector back into the parts when `f` returns or unwinds.
        struct Back<'a>(&'a Inner, ManuallyDrop<Vec<u8>>);
        impl Drop for Back<'_> {
            fn drop(&mut self) {
                // SAFETY: every stripe's exclusive lock is held (by `with`, which outlives
                // this guard), so nothing else reads or writes the parts; the vector is
                // taken out of the guard once, here, and not used after.
                let parts = unsafe { Parts::of(ManuallyDrop::take(&mut self.1)) };
                self.0.len.store(parts.len, Ordering::Release);
                // SAFETY: as above: every stripe's exclusive lock is held.
                unsafe { *self.0.parts.get() = parts };
            }
        }
        // SAFETY: every stripe's exclusive lock is held, so no other thread reads the parts
        // or reaches a byte; the parts describe a live vector (they are put back by `Back`
        // before the locks go, even if `f` unwinds, and nothing reads them meanwhile).
        let v = unsafe {
            let p = &*self.0.parts.get();
            Vec::from_raw_parts(p.ptr, p.len, p.cap)
        };
        let mut back = Back(&self.0, ManuallyDrop::new(v));
        f(&mut back.1)
    }

    /// Runs `f` on the `len` bytes at `offset`, while no other thread writes them; `None`
    /// (and `f` not run) when the range does not lie in the buffer.
    pub fn view<R>(&self, offset: u64, len: u64, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let (_locks, at) = self.0.locate(offset, len, |s| {
            s.read().unwrap_or_else(PoisonError::into_inner)
        });
        let at = at?;
        // SAFETY: `at` starts `len` of the vector's initialized bytes (checked under the
        // locks); every stripe covering them is locked shared, and the slice does not outlive
        // the locks: no thread writes these bytes meanwhile.
        let s = unsafe { std::slice::from_raw_parts(at, len as usize) };
        Some(f(s))
    }

    /// Runs `f` on the `len` bytes at `offset`, while no other thread reads or writes them;
    /// `None` (and `f` not run) when the range does not lie in the buffer.
    pub fn view_mut<R>(&self, offset: u64, len: u64, f: impl FnOnce(&mut [u8]) -> R) -> Option<R> {
        let (_locks, at) = self.0.locate(offset, len, |s| {
            s.write().unwrap_or_else(PoisonError::into_inner)
        });
        let at = at?;
        // SAFETY: `at` starts `len` of the vector's initialized bytes (checked under the
        // locks; from its own `as_mut_ptr`), every stripe covering them is locked exclusively,
        // and the slice does not outlive the locks: no other thread reaches them meanwhile.
        let s = unsafe { std::slice::from_raw_parts_mut(at, len as usize) };
        Some(f(s))
    }

    /// How many handles to the buffer there are, this one included: more than the owner's
    /// while a mesh still has bytes of it to send
    /// ([`TcpControl::send_control_shared`](crate::control::TcpControl::send_control_shared)).
    pub fn holders(&self) -> usize {
        Arc::strong_count(&self.0)
    }

    /// Length in bytes (what it was when asked: [`with`](Self::with) may change it at any
    /// time after; every range is checked again when it is reached).
    pub fn len(&self) -> usize {
        self.0.len.load(Ordering::Acquire)
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A copy of the bytes.
    pub fn to_vec(&self) -> Vec<u8> {
        self.with(|v| v.clone())
    }

    /// Writes `bytes` at `offset`; false (and nothing written) when the range does not fit.
    pub fn write_at(&self, offset: u64, bytes: &[u8]) -> bool {
        self.view_mut(offset, bytes.len() as u64, |d| d.copy_from_slice(bytes))
            .is_some()
    }

    /// Copies `len` bytes at `from` to `to` within the buffer; false (and nothing copied)
    /// when either range does not fit.
    pub fn copy_within(&self, from: u64, to: u64, len: u64) -> bool {
        let lo = from.min(to);
        let span = from.max(to).saturating_sub(lo).saturating_add(len);
        self.view_mut(lo, span, |v| {
            let (src, dst) = ((from - lo) as usize, (to - lo) as usize);
            v.copy_within(src..src + len as usize, dst);
        })
        .is_some()
    }

    /// Appends `len` bytes at `offset` to `out`; false (and nothing appended) when the range
    /// does not fit.
    pub fn read_at(&self, offset: u64, len: u64, out: &mut Vec<u8>) -> bool {
        self.view(offset, len, |s| out.extend_from_slice(s))
            .is_some()
    }
}

/// `offset..offset + len` if it lies within `0..size`.
pub(crate) fn range(offset: u64, len: u64, size: usize) -> Option<std::ops::Range<usize>> {
    let end = offset.checked_add(len)?;
    if end > size as u64 {
        return None;
    }
    Some(offset as usize..end as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;
    use std::thread;
    use std::time::Duration;

    #[test]
    fn stripes_are_64_kib_up_to_a_thousand_and_larger_beyond() {
        let stripes = |len: usize| {
            let b = OpBuffer::zeroed(len);
            (b.0.stripes.len(), 1usize << b.0.shift)
        };
        assert_eq!(stripes(0), (1, 64 << 10));
        assert_eq!(stripes(1), (1, 64 << 10));
        assert_eq!(stripes((64 << 10) + 1), (2, 64 << 10));
        assert_eq!(stripes(64 << 20), (1024, 64 << 10));
        assert_eq!(stripes((64 << 20) + 1), (513, 128 << 10));
        assert_eq!(stripes(256 << 20), (1024, 256 << 10));
    }

    #[test]
    fn ranges_outside_the_buffer_are_refused() {
        let b = OpBuffer::from_vec((0..=255).collect());
        assert_eq!(
            b.view(250, 6, <[u8]>::to_vec),
            Some(vec![250, 251, 252, 253, 254, 255])
        );
        assert_eq!(b.view(250, 7, |_| ()), None);
        assert_eq!(b.view_mut(256, 1, |_| ()), None);
        assert_eq!(b.view(u64::MAX, 2, |_| ()), None);
        assert_eq!(b.view(256, 0, <[u8]>::len), Some(0));
        assert!(!b.write_at(255, &[1, 2]));
        assert!(!b.copy_within(0, 200, 57));
        let mut out = vec![9];
        assert!(!b.read_at(200, 57, &mut out));
        assert_eq!(out, [9]);
        assert_eq!(b.to_vec(), (0..=255).collect::<Vec<u8>>());
    }

    #[test]
    fn writes_and_copies_across_stripes_land_whole() {
        let len = 5 * (64 << 10) + 123;
        let b = OpBuffer::zeroed(len);
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        assert!(b.write_at(1000, &data));
        let mut out = Vec::new();
        assert!(b.read_at(1000, data.len() as u64, &mut out));
        assert_eq!(out, data);
        // Overlapping, forwards and backwards, over stripe boundaries.
        assert!(b.copy_within(1000, 70_000, 200_000));
        let mut want = vec![0u8; len];
        want[1000..201_000].copy_from_slice(&data);
        want.copy_within(1000..201_000, 70_000);
        assert_eq!(b.to_vec(), want);
        assert!(b.copy_within(70_000, 500, 100_000));
        want.copy_within(70_000..170_000, 500);
        assert_eq!(b.to_vec(), want);
    }

    #[test]
    fn the_whole_vector_may_be_resized_or_taken() {
        let b = OpBuffer::zeroed(10);
        b.with(|v| v.resize(200_000, 7));
        assert_eq!(b.len(), 200_000);
        // Past the stripes there were: all in the last one.
        assert!(b.write_at(199_990, &[1; 10]));
        assert_eq!(
            b.view(199_989, 11, <[u8]>::to_vec),
            Some([vec![7], vec![1; 10]].concat())
        );
        let taken = b.with(std::mem::take);
        assert_eq!(taken.len(), 200_000);
        assert!(b.is_empty());
        assert_eq!(b.view(0, 1, |_| ()), None);
    }

    #[test]
    fn a_buffer_held_whole_is_printed_without_waiting() {
        let b = OpBuffer::zeroed(3);
        assert_eq!(format!("{b:?}"), "OpBuffer { len: 3, stripes: 1 }");
        let inside = b.with(|v| {
            v.push(1);
            format!("{b:?}")
        });
        // The length as `with` found it: what it does shows once it returns.
        assert_eq!(inside, "OpBuffer { len: 3, stripes: 1 }");
        assert_eq!(b.len(), 4);
    }

    #[test]
    fn a_panic_inside_with_leaves_the_buffer_whole() {
        let b = OpBuffer::zeroed(16);
        let c = b.clone();
        let r = std::panic::catch_unwind(move || {
            c.with(|v| {
                v.extend_from_slice(&[5; 100]);
                panic!("inside");
            })
        });
        assert!(r.is_err());
        assert_eq!(b.len(), 116);
        assert_eq!(b.view(16, 100, <[u8]>::to_vec), Some(vec![5; 100]));
    }

    /// Holds `view_mut` of `at..at + len` on another thread until told to let go.
    fn hold(b: &OpBuffer, at: u64, len: u64) -> (mpsc::Sender<()>, thread::JoinHandle<()>) {
        let (held_tx, held_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let b = b.clone();
        let h = thread::spawn(move || {
            b.view_mut(at, len, |v| {
                v.fill(1);
                held_tx.send(()).expect("held");
                let _ = go_rx.recv();
            })
            .expect("in range");
        });
        held_rx.recv().expect("held");
        (go_tx, h)
    }

    #[test]
    fn ranges_in_other_stripes_are_reached_while_one_is_written() {
        let b = OpBuffer::zeroed(1 << 20);
        let (go, h) = hold(&b, 0, 64 << 10);
        let (done_tx, done_rx) = mpsc::channel();
        let c = b.clone();
        let other = thread::spawn(move || {
            c.view(64 << 10, 4096, |_| ()).expect("in range");
            assert!(c.write_at(512 << 10, &[2; 4096]));
            assert!(c.read_at(900 << 10, 100, &mut Vec::new()));
            done_tx.send(()).expect("done");
        });
        // Generous: only a deadlock (one lock for the whole buffer) fails this.
        let reached = done_rx.recv_timeout(Duration::from_secs(30));
        go.send(()).expect("release");
        h.join().expect("holder");
        other.join().expect("other");
        assert!(reached.is_ok(), "a disjoint range waited for the writer");
    }

    #[test]
    fn a_range_being_written_is_neither_read_nor_written_meanwhile() {
        let b = OpBuffer::zeroed(1 << 20);
        let (go, h) = hold(&b, 100 << 10, 10);
        let (done_tx, done_rx) = mpsc::channel();
        let c = b.clone();
        let reader = thread::spawn(move || {
            // Overlaps the held range's stripe only, not its bytes: still held off.
            let seen = c.view(64 << 10, 40 << 10, |v| {
                v[36 << 10..(36 << 10) + 10].to_vec()
            });
            done_tx.send(seen).expect("done");
        });
        assert!(
            done_rx.recv_timeout(Duration::from_millis(100)).is_err(),
            "read a stripe while it was written"
        );
        go.send(()).expect("release");
        assert_eq!(done_rx.recv().expect("read"), Some(vec![1; 10]));
        h.join().expect("holder");
        reader.join().expect("reader");
    }
}
