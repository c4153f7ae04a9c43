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
//! A buffer may also be *lent* ([`OpBuffer::lend`]): it then reaches a caller's slice for as
//! long as a closure runs, so that a blocking collective reads and writes the caller's memory
//! instead of a copy of it. When the closure returns or unwinds, the buffer lets go of the
//! slice under every stripe's exclusive lock: it keeps a copy of its bytes if another handle
//! is left (an engine thread that has not let go yet), else nothing.
//!
//! A lent buffer may also have a *source* ([`OpBuffer::lend_with`]): a second, read-only
//! slice whose bytes belong at a range of the first, copied in one stripe at a time, the first
//! time any access reaches that stripe, and whatever is left when the closure returns. A
//! blocking Allgather's own block is so copied by the send workers just before they send it
//! (the copy then leaves it in their cache), rather than by the caller before the operation
//! starts, which delayed every rank's first send by a copy of its whole block.
//!
//! A buffer may hold a vector of any plain type ([`OpBuffer::from_typed`]: a `Vec<f32>`'s
//! bytes, its allocation kept with its alignment), which [`OpBuffer::take`] hands back as a
//! [`Taken`] that becomes the same vector again: a non-blocking call's vector is moved, never
//! copied.
//!
//! This module's `unsafe` is the vector's raw parts (with the alignment it was allocated
//! with), or a lent slice's, and a source's: kept apart so that a range can be handed out
//! without a reference to the whole vector, put back together under every lock.
#![allow(unsafe_code)]

use std::cell::UnsafeCell;
use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use bytemuck::Pod;

/// The smallest stripe: 64 KiB, about one GSO batch (fifteen 4 KiB chunks, or two of 32 640
/// bytes).
const MIN_STRIPE_SHIFT: u32 = 16;

/// The most stripes a buffer is cut into (a 64 MiB buffer has 1024 of 64 KiB; a larger one
/// has larger stripes).
pub(crate) const MAX_STRIPES: usize = 1024;

/// A vector taken apart (what `Vec::from_raw_parts` needs), or a lent slice.
struct Parts {
    ptr: *mut u8,
    /// Initialized bytes.
    len: usize,
    /// Bytes allocated.
    cap: usize,
    /// The alignment the bytes were allocated with: 1 for a `Vec<u8>`'s, `align_of::<T>()`
    /// for a `Vec<T>`'s ([`OpBuffer::from_typed`]).
    align: usize,
    /// The bytes are a caller's slice ([`OpBuffer::lend`]), never freed here and never made
    /// a vector: `cap` and `align` mean nothing then.
    lent: bool,
}

impl Parts {
    fn of(v: Vec<u8>) -> Self {
        let mut v = ManuallyDrop::new(v);
        Parts {
            ptr: v.as_mut_ptr(),
            len: v.len(),
            cap: v.capacity(),
            align: 1,
            lent: false,
        }
    }

    /// A vector of any plain type, as bytes: moved, not copied.
    fn of_typed<T: Pod>(v: Vec<T>) -> Self {
        let size = std::mem::size_of::<T>();
        if size == 0 {
            // No bytes (and a capacity that means nothing).
            return Parts::of(Vec::new());
        }
        let mut v = ManuallyDrop::new(v);
        Parts {
            ptr: v.as_mut_ptr().cast(),
            len: v.len() * size,
            cap: v.capacity() * size,
            align: std::mem::align_of::<T>(),
            lent: false,
        }
    }

    /// A `Vec<u8>`'s parts (the storage every `with` works on).
    fn is_byte_vec(&self) -> bool {
        !self.lent && self.align == 1
    }

    /// Frees what the parts own.
    ///
    /// # Safety
    /// A caller's SAFETY argument shows that the parts describe what they say
    /// (`Parts::of`, `of_typed`, or a lent slice) and are not used after.
    unsafe fn free(&mut self) {
        if self.lent {
            return;
        }
        if self.align == 1 {
            // SAFETY: a `Vec<u8>`'s parts, or a `Vec<T>`'s with `T` of alignment 1: the same
            // allocation (`cap` bytes, alignment 1) as a `Vec<u8>` of that capacity.
            drop(unsafe { Vec::from_raw_parts(self.ptr, self.len, self.cap) });
        } else if self.cap > 0 {
            // SAFETY: a `Vec<T>`'s allocation (`of_typed`), of `cap` bytes at `align`: the
            // layout the global allocator was asked for (`Layout::array::<T>`), which is
            // valid, since it was.
            unsafe {
                std::alloc::dealloc(
                    self.ptr,
                    std::alloc::Layout::from_size_align_unchecked(self.cap, self.align),
                )
            }
        }
    }
}

/// An operation's bytes taken out of its buffer ([`OpBuffer::take`]): the allocation they
/// came in, whatever vector that was, freed when dropped; [`Taken::into_vec`] makes it a
/// vector again without a copy when the type matches the one it came as.
pub struct Taken(Parts);

// SAFETY: `Taken` owns its allocation alone (taken out of the buffer under every stripe's
// lock, never lent), like the vector it came from, which is `Send`.
unsafe impl Send for Taken {}

impl fmt::Debug for Taken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Taken").field("len", &self.0.len).finish()
    }
}

impl Drop for Taken {
    fn drop(&mut self) {
        // SAFETY: the parts are the buffer's, taken out whole (`OpBuffer::take`), and not
        // used after.
        unsafe { self.0.free() }
    }
}

impl Taken {
    /// Bytes held.
    pub fn len(&self) -> usize {
        self.0.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.0.len == 0
    }

    /// The bytes as a `Vec<T>`: the same allocation when it came as a vector of a type of
    /// `T`'s alignment and the lengths divide by `T`'s size (a vector of `T` handed to
    /// [`OpBuffer::from_typed`] comes back as itself), else a copy (the last element padded
    /// with zeros, should the bytes not fill it).
    pub fn into_vec<T: Pod>(self) -> Vec<T> {
        let size = std::mem::size_of::<T>();
        let p = &self.0;
        if size == 0 {
            return Vec::new();
        }
        if p.align == std::mem::align_of::<T>()
            && p.len.is_multiple_of(size)
            && p.cap.is_multiple_of(size)
        {
            let this = ManuallyDrop::new(self);
            let p = &this.0;
            // The allocation (`cap` bytes at `align`, owned by `this`, which is not dropped)
            // is what `Vec<T>` of capacity `cap / size` allocates: `T`'s alignment, `cap`
            // bytes; with `cap` 0 nothing was allocated, and `ptr` is a vector's dangling one,
            // non-null and aligned to `align`, `T`'s. An empty vector comes back so too.
            // SAFETY: so the parts are a `Vec<T>`'s; its first `len` bytes, `len / size`
            // whole `T`s, are initialized, and any bytes are a valid `T` (`Pod`).
            return unsafe { Vec::from_raw_parts(p.ptr.cast::<T>(), p.len / size, p.cap / size) };
        }
        // SAFETY: the parts' first `len` bytes are initialized and owned by `self`, which
        // outlives the slice.
        let bytes = unsafe { std::slice::from_raw_parts(p.ptr, p.len) };
        let mut out = vec![T::zeroed(); p.len.div_ceil(size)];
        bytemuck::cast_slice_mut::<T, u8>(&mut out)[..p.len].copy_from_slice(bytes);
        out
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
    /// A lender's read-only bytes that belong in the buffer ([`OpBuffer::lend_with`]), copied
    /// in stripe by stripe; `None` once every stripe has its part. Changed only under every
    /// stripe's exclusive lock; read under at least one stripe's.
    source: UnsafeCell<Option<Source>>,
    /// Per stripe: whether its part of the source is in place (true where the source has
    /// none). Set only under the stripe's exclusive lock.
    staged: Box<[AtomicBool]>,
    /// Stripes whose part of the source is not in place yet: with none, an access looks at
    /// no flag.
    unstaged: AtomicUsize,
}

/// A lent read-only slice whose `len` bytes belong at byte `at` of the buffer.
struct Source {
    ptr: *const u8,
    len: usize,
    at: usize,
}

// Why `Inner` may be sent and shared: it owns the vector its parts describe (a `Vec<u8>` or a
// `Vec<T>` of a `Pod` type: `Send` and `Sync`), or holds a lent `&mut [u8]` (`Send` and `Sync`
// too) that `lend` takes back, under every stripe's exclusive lock, before its borrow ends,
// and maybe a lent `&[u8]` (its source, `Send` and `Sync`, only read) that it lets go of at
// the same time. Its headers (`parts`, `source`) are written only under every stripe's
// exclusive lock (`with`, `take`, `to_vec`, `lend`'s end), and read only by holders of at
// least one stripe's lock, so no read meets a write. Its bytes are reached only through
// `view` (shared locks of every stripe the range covers) and `view_mut` (exclusive locks of
// the same) or under every exclusive lock, and a stripe's part of the source is copied in
// under that stripe's exclusive lock: two threads that reach a common byte hold a common
// stripe's lock, so a byte is written by one thread at a time and never while another reads
// it.
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
        // SAFETY: the parts describe what they say and are not used after this; `&mut self`
        // means no other access is left. (Lent ones are not reached: `lend` holds a handle
        // until it took the slice back; they would free nothing in any case.)
        unsafe { self.parts.get_mut().free() }
    }
}

impl Inner {
    /// Every stripe's exclusive lock, in order: nothing else reaches the parts or a byte while
    /// they are held.
    fn lock_all(&self) -> Vec<std::sync::RwLockWriteGuard<'_, ()>> {
        self.stripes
            .iter()
            .map(|s| s.write().unwrap_or_else(PoisonError::into_inner))
            .collect()
    }

    /// Copies stripe `s`'s part of the source in, if it is not in place yet. Takes the
    /// stripe's exclusive lock to do so: call it holding no stripe's lock.
    fn stage(&self, s: usize) {
        if self.staged[s].load(Ordering::Acquire) {
            return;
        }
        let _lock = self.stripes[s]
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        self.stage_locked(s);
    }

    /// Copies stripe `s`'s part of the source in, if it is not in place yet. Call it only with
    /// stripe `s`'s exclusive lock held.
    fn stage_locked(&self, s: usize) {
        if self.staged[s].load(Ordering::Acquire) {
            return;
        }
        // Stripe `s`'s bytes: from `s << shift` to the next stripe's (the last, to the end).
        let start = s << self.shift;
        let end = if s + 1 == self.stripes.len() {
            usize::MAX
        } else {
            (s + 1) << self.shift
        };
        // A source was checked to lie within the parts' bytes when lent, and is there until
        // every stripe is staged (`stage_all_locked`, before the parts change): the copy's
        // two ranges lie in a live, initialized source and in stripe `s`'s bytes of the
        // parts. The source is a shared borrow and the parts the lender's exclusive one, so
        // the two do not overlap.
        // SAFETY: stripe `s`'s exclusive lock is held, so nothing changes the headers (that
        // takes every stripe's exclusive lock) and no other thread reaches the stripe's bytes;
        // the ranges are valid (above).
        unsafe {
            if let Some(src) = &*self.source.get() {
                let lo = start.max(src.at);
                let hi = end.min(src.at + src.len);
                if lo < hi {
                    let p = &*self.parts.get();
                    std::ptr::copy_nonoverlapping(src.ptr.add(lo - src.at), p.ptr.add(lo), hi - lo);
                }
            }
        }
        self.staged[s].store(true, Ordering::Release);
        self.unstaged.fetch_sub(1, Ordering::AcqRel);
    }

    /// Copies every part of the source not in place yet in, and lets go of the source. Call
    /// it only with every stripe's exclusive lock held.
    fn stage_all_locked(&self) {
        if self.unstaged.load(Ordering::Acquire) > 0 {
            for s in 0..self.stripes.len() {
                self.stage_locked(s);
            }
        }
        // SAFETY: every stripe's exclusive lock is held, so no other thread reads the header;
        // every stripe has its part, so nothing needs the source again.
        unsafe { *self.source.get() = None };
    }

    /// Makes the parts a `Vec<u8>`'s, from here on: lent ones become `lent(bytes)` (the
    /// buffer no longer reaches the lender's slice), a typed vector's a copy of its bytes.
    /// Call it only with every stripe's exclusive lock held.
    fn bytes_locked(&self, lent: impl FnOnce(&[u8]) -> Vec<u8>) {
        self.stage_all_locked();
        // Lent parts describe a live `&mut [u8]`: `lend` still borrows it (it calls this
        // before returning), so the slice is valid; owned ones are freed once copied, and
        // replaced.
        // SAFETY: the caller holds every stripe's exclusive lock, so no other thread reads
        // or writes the parts or a byte meanwhile; the parts are valid (above).
        unsafe {
            let p = &mut *self.parts.get();
            if p.is_byte_vec() {
                return;
            }
            let bytes = std::slice::from_raw_parts(p.ptr, p.len);
            let owned = if p.lent { lent(bytes) } else { bytes.to_vec() };
            p.free();
            *p = Parts::of(owned);
            self.len.store(p.len, Ordering::Release);
        }
    }

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
        if self.unstaged.load(Ordering::Acquire) > 0 {
            (first..=last).for_each(|s| self.stage(s));
        }
        let held = Held::each(&self.stripes[first..=last], lock);
        // SAFETY: a stripe's lock is held, so nothing changes the parts (that takes every
        // stripe's exclusive lock: `with`, `take`, the end of `lend`).
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

impl From<Vec<u8>> for OpBuffer {
    fn from(v: Vec<u8>) -> Self {
        Self::from_vec(v)
    }
}

impl OpBuffer {
    /// A zeroed buffer of `len` bytes.
    pub fn zeroed(len: usize) -> Self {
        Self::from_vec(vec![0; len])
    }

    /// A buffer holding `v` (not copied).
    pub fn from_vec(v: Vec<u8>) -> Self {
        Self::of_parts(Parts::of(v))
    }

    /// A buffer holding the bytes of `v`, a vector of any plain type (moved, not copied: a
    /// `Vec<f32>` cannot become a `Vec<u8>`, whose allocation would have another alignment,
    /// but its bytes can be the buffer's). [`take`](Self::take) hands the vector back.
    pub fn from_typed<T: Pod>(v: Vec<T>) -> Self {
        Self::of_parts(Parts::of_typed(v))
    }

    /// Runs `f` with a buffer over `bytes`, not copied: what the port and the threads that
    /// share the handle read and write are the caller's bytes, while `f` runs. When `f`
    /// returns or unwinds, the buffer lets go of `bytes` (once any access in progress is
    /// over): a handle still held elsewhere then reaches a copy of them, made only in that
    /// case (and only where the memory for it can be had), or nothing once
    /// [`take`](Self::take) was called. Nothing reaches `bytes` after
    /// `lend` returns; a handle cannot outlive the borrow with it.
    ///
    /// What a blocking collective runs on: the caller's slice is the operation's buffer, as
    /// with MPI, instead of a copy in and a copy out.
    pub fn lend<R>(bytes: &mut [u8], f: impl FnOnce(&OpBuffer) -> R) -> R {
        Self::lend_with(bytes, &[], 0, f)
    }

    /// [`lend`](Self::lend), with `source`'s bytes belonging at byte `at` of `bytes`: each
    /// stripe's part of them is copied in the first time any access reaches that stripe, and
    /// whatever is left when `f` returns or unwinds (or at [`take`](Self::take),
    /// [`to_vec`](Self::to_vec) or [`with`](Self::with)). Every access sees them in place,
    /// as if they had been copied in before. `source` is only read.
    ///
    /// What a blocking Allgather runs on: the caller's receive buffer, and its send buffer as
    /// the source of its own block, copied in by the send workers as they send it.
    ///
    /// # Panics
    /// If `source` does not fit in `bytes` at `at`.
    pub fn lend_with<R>(
        bytes: &mut [u8],
        source: &[u8],
        at: usize,
        f: impl FnOnce(&OpBuffer) -> R,
    ) -> R {
        assert!(
            at.checked_add(source.len())
                .is_some_and(|end| end <= bytes.len()),
            "a source of {} bytes at {at} does not fit in {} bytes",
            source.len(),
            bytes.len()
        );
        /// Takes the slice back when `lend` returns or unwinds.
        struct Back(OpBuffer);
        impl Drop for Back {
            fn drop(&mut self) {
                let inner = &self.0.0;
                let _locks = inner.lock_all();
                // One handle (this one): nobody else can reach the bytes, so none are kept.
                // The count cannot rise meanwhile: only a holder of a handle makes another.
                let alone = Arc::strong_count(inner) == 1;
                inner.bytes_locked(|b| {
                    let mut kept = Vec::new();
                    // A copy that cannot be had leaves the other handles nothing (their
                    // accesses miss), rather than aborting the process over a buffer the
                    // caller is done with.
                    if !alone && kept.try_reserve_exact(b.len()).is_ok() {
                        kept.extend_from_slice(b);
                    }
                    kept
                });
            }
        }
        let parts = Parts {
            ptr: bytes.as_mut_ptr(),
            len: bytes.len(),
            cap: 0,
            align: 1,
            lent: true,
        };
        let source = (!source.is_empty()).then_some(Source {
            ptr: source.as_ptr(),
            len: source.len(),
            at,
        });
        let back = Back(Self::with_source(parts, source));
        f(&back.0)
    }

    /// Whether the buffer reaches a lender's slice ([`lend`](Self::lend)) now.
    pub fn is_lent(&self) -> bool {
        let _lock = self.0.stripes[0]
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        // SAFETY: a stripe's lock is held, so `with`, `take` and `lend` are not changing the
        // parts.
        unsafe { (*self.0.parts.get()).lent }
    }

    /// Takes the bytes out, leaving the buffer empty: the allocation they are in, or, for a
    /// lent buffer, nothing (the bytes stay where they are, in the lender's slice, which the
    /// buffer no longer reaches). Waits for any access in progress.
    pub fn take(&self) -> Taken {
        let _locks = self.0.lock_all();
        self.0.stage_all_locked();
        // SAFETY: every stripe's exclusive lock is held, so nothing else reads or writes the
        // parts; owned ones move out whole into the `Taken` (which frees them), lent ones are
        // let go of; either way they are replaced by an empty vector's.
        unsafe {
            let p = &mut *self.0.parts.get();
            let parts = std::mem::replace(p, Parts::of(Vec::new()));
            self.0.len.store(0, Ordering::Release);
            if parts.lent {
                return Taken(Parts::of(Vec::new()));
            }
            Taken(parts)
        }
    }

    fn of_parts(parts: Parts) -> Self {
        Self::with_source(parts, None)
    }

    /// A buffer of `parts`, with `source` (which lies within them) still to copy in.
    fn with_source(parts: Parts, source: Option<Source>) -> Self {
        let len = parts.len as u64;
        let mut shift = MIN_STRIPE_SHIFT;
        while len.div_ceil(1 << shift) > MAX_STRIPES as u64 {
            shift += 1;
        }
        let count = usize::try_from(len.div_ceil(1 << shift))
            .map_or(MAX_STRIPES, |c| c.clamp(1, MAX_STRIPES));
        // Stripe `s` has a part of the source if the source starts before the next stripe
        // (the last: at all) and ends after `s` starts.
        let stage = |s: usize| {
            source.as_ref().is_some_and(|src| {
                (s + 1 == count || src.at < (s + 1) << shift) && src.at + src.len > s << shift
            })
        };
        let staged: Box<[AtomicBool]> = (0..count).map(|s| AtomicBool::new(!stage(s))).collect();
        let unstaged = (0..count).filter(|&s| stage(s)).count();
        OpBuffer(Arc::new(Inner {
            shift,
            stripes: (0..count).map(|_| RwLock::new(())).collect(),
            len: AtomicUsize::new(parts.len),
            parts: UnsafeCell::new(parts),
            source: UnsafeCell::new(source),
            staged,
            unstaged: AtomicUsize::new(unstaged),
        }))
    }

    /// Runs `f` on the whole vector, which it may also resize or take, while no other thread
    /// reaches any of it. A lent buffer first lets go of the lender's slice for a copy of it
    /// (see [`lend`](Self::lend)); [`take`](Self::take) takes the bytes out without one.
    pub fn with<R>(&self, f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
        let _locks = self.0.lock_all();
        self.0.bytes_locked(<[u8]>::to_vec);
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
        // The parts describe a live `Vec<u8>` (`bytes_locked` just made sure); they are put
        // back by `Back` before the locks go, even if `f` unwinds, and nothing reads them
        // meanwhile.
        // SAFETY: every stripe's exclusive lock is held, so no other thread reads the parts
        // or reaches a byte, and the parts are a `Vec<u8>`'s (above).
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
    ///
    /// A lent buffer's own handle (the one [`lend`](Self::lend) passes its closure, held until
    /// `lend` returns) is not counted: once the caller's clone is the last one left, the count
    /// is one, as for an owned buffer.
    pub fn holders(&self) -> usize {
        let n = Arc::strong_count(&self.0);
        if self.is_lent() { n - 1 } else { n }
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

    /// A copy of the bytes (a lent buffer stays lent).
    pub fn to_vec(&self) -> Vec<u8> {
        let _locks = self.0.lock_all();
        self.0.stage_all_locked();
        // SAFETY: every stripe's exclusive lock is held, so the parts do not change and no
        // byte is written meanwhile; they describe `len` initialized bytes (a vector's, or a
        // lent slice that `lend` still borrows).
        unsafe {
            let p = &*self.0.parts.get();
            std::slice::from_raw_parts(p.ptr, p.len).to_vec()
        }
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
    fn a_typed_vector_is_held_without_a_copy_and_comes_back_as_itself() {
        let mut v: Vec<f64> = Vec::with_capacity(20_000);
        v.extend((0..12_000).map(f64::from));
        let at = v.as_ptr();
        let b = OpBuffer::from_typed(v);
        assert_eq!(b.len(), 96_000);
        // Bytes across a stripe's end: element 8191 and the next.
        assert!(b.write_at(65_528, &2.5f64.to_ne_bytes()));
        assert_eq!(
            b.view(65_536, 8, <[u8]>::to_vec),
            Some(8192f64.to_ne_bytes().to_vec())
        );
        let back: Vec<f64> = b.take().into_vec();
        assert!(b.is_empty());
        assert_eq!(
            (back.as_ptr(), back.len(), back.capacity()),
            (at, 12_000, 20_000)
        );
        assert_eq!((back[8190], back[8191], back[8192]), (8190.0, 2.5, 8192.0));
        // Dropped without taking: freed (Miri checks).
        drop(OpBuffer::from_typed(vec![1u32; 5000]));
        drop(OpBuffer::from_typed(Vec::<u64>::with_capacity(3)).take());
    }

    #[test]
    fn an_empty_vector_comes_back_as_itself_with_its_capacity() {
        let v: Vec<f64> = Vec::with_capacity(100);
        let at = v.as_ptr();
        let back: Vec<f64> = OpBuffer::from_typed(v).take().into_vec();
        assert_eq!((back.as_ptr(), back.len(), back.capacity()), (at, 0, 100));
        let v: Vec<u8> = Vec::with_capacity(50);
        let at = v.as_ptr();
        let back: Vec<u8> = OpBuffer::from_vec(v).take().into_vec();
        assert_eq!((back.as_ptr(), back.len(), back.capacity()), (at, 0, 50));
        // Another alignment, or nothing allocated: an empty vector all the same.
        let other: Vec<u32> = OpBuffer::from_typed(Vec::<u16>::with_capacity(8))
            .take()
            .into_vec();
        assert!(other.is_empty());
        let none: Vec<u64> = OpBuffer::from_typed(Vec::<u64>::new()).take().into_vec();
        assert!(none.is_empty());
        let mut mine = [1u8; 4];
        let lent: Vec<u16> = OpBuffer::lend(&mut mine, OpBuffer::take).into_vec();
        assert!(lent.is_empty());
    }

    #[test]
    fn bytes_taken_become_another_type_by_a_copy_only_where_they_must() {
        let words = || (0..1000u32).collect::<Vec<u32>>();
        // Same alignment: the same allocation.
        let v = words();
        let at = v.as_ptr() as usize;
        let f: Vec<f32> = OpBuffer::from_typed(v).take().into_vec();
        assert_eq!((f.as_ptr() as usize, f.len()), (at, 1000));
        assert_eq!(f[7].to_bits(), 7);
        // Another alignment: copied.
        let bytes: Vec<u8> = OpBuffer::from_typed(words()).take().into_vec();
        assert_eq!(
            bytes[..8],
            [0u32.to_ne_bytes(), 1u32.to_ne_bytes()].concat()
        );
        let wide: Vec<u64> = OpBuffer::from_typed(words()).take().into_vec();
        assert_eq!(wide.len(), 500);
        // Bytes that do not fill the last element: zeros after them.
        let odd: Vec<u16> = OpBuffer::from_vec(vec![1, 2, 3]).take().into_vec();
        assert_eq!(
            odd,
            [u16::from_ne_bytes([1, 2]), u16::from_ne_bytes([3, 0])]
        );
        // `with` works on a byte vector: a typed one becomes a copy first.
        let b = OpBuffer::from_typed(words());
        b.with(|v| v.truncate(8));
        assert_eq!(b.take().into_vec::<u32>(), [0, 1]);
    }

    #[test]
    fn a_lent_buffer_is_the_callers_bytes_and_a_handle_kept_past_it_a_copy() {
        let mut mine = vec![0u8; 200_000];
        let kept = OpBuffer::lend(&mut mine, |b| {
            assert!(b.is_lent());
            // The lender's own handle (`b`) is not counted.
            assert_eq!(b.holders(), 0);
            let c = b.clone();
            assert_eq!(c.holders(), 1);
            drop(c);
            assert_eq!(b.len(), 200_000);
            assert!(b.write_at(70_000, &[7; 10]));
            assert!(!b.write_at(199_999, &[1, 2]));
            assert_eq!(b.view(69_999, 12, <[u8]>::to_vec).map(|v| v[1]), Some(7));
            b.clone()
        });
        assert_eq!(&mine[70_000..70_010], &[7; 10]);
        // The handle kept reaches a copy, never the slice lent.
        assert!(!kept.is_lent());
        assert_eq!(kept.len(), 200_000);
        assert_eq!(kept.view(70_000, 10, <[u8]>::to_vec), Some(vec![7; 10]));
        assert!(kept.write_at(0, &[9; 4]));
        assert_eq!(mine[..4], [0; 4]);
        assert_eq!(kept.take().len(), 200_000);
    }

    #[test]
    fn a_lent_buffer_taken_lets_go_of_the_slice_without_a_copy() {
        let mut mine = vec![1u8; 5000];
        let kept = OpBuffer::lend(&mut mine, |b| {
            assert!(b.write_at(10, &[5; 5]));
            // The bytes stay in the slice: the vector taken is empty.
            assert!(b.take().is_empty());
            assert!(!b.is_lent());
            assert!(b.is_empty());
            assert!(!b.write_at(0, &[6]));
            b.clone()
        });
        assert!(kept.is_empty());
        assert_eq!(&mine[8..16], &[1, 1, 5, 5, 5, 5, 5, 1]);
    }

    #[test]
    fn with_on_a_lent_buffer_works_on_a_copy() {
        let mut mine = vec![3u8; 100];
        OpBuffer::lend(&mut mine, |b| {
            assert!(b.write_at(0, &[4]));
            assert_eq!(b.to_vec()[..2], [4, 3]);
            assert!(b.is_lent(), "to_vec copies without letting go");
            b.with(|v| v.push(8));
            assert!(!b.is_lent());
            assert!(b.write_at(1, &[4]));
            assert_eq!(b.len(), 101);
        });
        assert_eq!(mine[..2], [4, 3]);
        assert_eq!(mine.len(), 100);
    }

    #[test]
    fn a_panic_inside_lend_still_lets_go_of_the_slice() {
        let mut mine = vec![0u8; 64];
        let stash = std::sync::Mutex::new(None);
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            OpBuffer::lend(&mut mine, |b| {
                assert!(b.write_at(0, &[2; 8]));
                *stash.lock().unwrap() = Some(b.clone());
                panic!("inside");
            })
        }));
        assert!(r.is_err());
        let kept = stash.lock().unwrap().take().expect("stashed");
        assert!(!kept.is_lent());
        assert!(kept.write_at(0, &[7; 8]));
        assert_eq!(
            kept.view(0, 9, <[u8]>::to_vec),
            Some([vec![7; 8], vec![0]].concat())
        );
        assert_eq!(mine[..9], [2, 2, 2, 2, 2, 2, 2, 2, 0]);
    }

    #[test]
    fn nothing_reaches_a_lent_slice_once_lend_returned() {
        use std::sync::atomic::AtomicBool;
        let stop = Arc::new(AtomicBool::new(false));
        let mut mine = vec![0u8; 3 << 16];
        let (started_tx, started_rx) = mpsc::channel();
        let writer = OpBuffer::lend(&mut mine, |b| {
            let (c, stop) = (b.clone(), stop.clone());
            let writer = thread::spawn(move || {
                let mut n = 0u8;
                let mut wrote = 0u32;
                while !stop.load(Ordering::Relaxed) {
                    n = n.wrapping_add(1).max(1);
                    // Across a stripe's end.
                    assert!(c.write_at((1 << 16) - 2, &[n; 4]));
                    assert!(c.write_at(0, &[n]));
                    wrote += 1;
                    if wrote == 3 {
                        started_tx.send(()).expect("started");
                    }
                    thread::yield_now();
                }
            });
            started_rx.recv().expect("writer started");
            writer
        });
        let seen = mine.clone();
        assert_ne!(
            seen[(1 << 16) - 2],
            0,
            "the writer reached the slice while lent"
        );
        thread::sleep(Duration::from_millis(20));
        stop.store(true, Ordering::Relaxed);
        writer.join().expect("writer");
        assert_eq!(mine, seen, "a write reached the slice after lend returned");
    }

    /// 100 000 bytes that differ from their neighbours and from zero.
    fn own_block() -> Vec<u8> {
        (0..100_000u32).map(|i| (i % 251 + 1) as u8).collect()
    }

    #[test]
    fn a_source_is_in_place_for_every_access_and_in_the_slice_after() {
        let src = own_block();
        // Four stripes; the source covers stripe 0's end to stripe 2's middle.
        let mut mine = vec![0u8; 200_000];
        OpBuffer::lend_with(&mut mine, &src, 50_000, |b| {
            assert_eq!(b.0.unstaged.load(Ordering::Relaxed), 3);
            assert_eq!(b.view(49_998, 4, <[u8]>::to_vec), Some(vec![0, 0, 1, 2]));
            assert_eq!(b.0.unstaged.load(Ordering::Relaxed), 2, "stripe 0 only");
            // A write where the source is still to come stays written.
            assert!(b.write_at(140_000, &[0; 3]));
            assert_eq!(b.0.unstaged.load(Ordering::Relaxed), 1, "and stripe 2");
            assert_eq!(
                b.view(139_999, 5, <[u8]>::to_vec),
                Some(vec![src[89_999], 0, 0, 0, src[90_003]])
            );
            // A read that lies beyond the source copies nothing.
            assert_eq!(b.view(180_000, 2, <[u8]>::to_vec), Some(vec![0, 0]));
            assert_eq!(b.0.unstaged.load(Ordering::Relaxed), 1);
        });
        // Stripe 1 was never reached: copied in as `lend_with` let go.
        let mut want = vec![0u8; 200_000];
        want[50_000..150_000].copy_from_slice(&src);
        want[140_000..140_003].fill(0);
        assert_eq!(mine, want);
    }

    #[test]
    fn a_source_is_in_place_when_taken_copied_or_kept() {
        let src = own_block();
        let mut want = vec![9u8; 150_000];
        want[20_000..120_000].copy_from_slice(&src);
        // Taken at once: every stripe copied in, the slice let go of.
        let mut mine = vec![9u8; 150_000];
        OpBuffer::lend_with(&mut mine, &src, 20_000, |b| {
            assert!(b.take().is_empty());
            assert_eq!(b.0.unstaged.load(Ordering::Relaxed), 0);
        });
        assert_eq!(mine, want);
        // Copied, and a handle kept past the lender: both see the source.
        let mut mine = vec![9u8; 150_000];
        let kept = OpBuffer::lend_with(&mut mine, &src, 20_000, |b| {
            assert_eq!(b.to_vec(), want);
            b.clone()
        });
        assert_eq!(mine, want);
        assert_eq!(kept.to_vec(), want);
        // An empty source, or one at the very end, is no source.
        let mut mine = vec![9u8; 10];
        OpBuffer::lend_with(&mut mine, &[], 10, |b| {
            assert_eq!(b.0.unstaged.load(Ordering::Relaxed), 0);
        });
    }

    #[test]
    #[should_panic(expected = "does not fit")]
    fn a_source_that_does_not_fit_is_refused() {
        let mut mine = vec![0u8; 10];
        OpBuffer::lend_with(&mut mine, &[1; 4], 7, |_| ());
    }

    #[test]
    fn threads_that_reach_a_source_at_once_each_see_it_whole() {
        let src = own_block();
        let mut mine = vec![0u8; 100_000];
        OpBuffer::lend_with(&mut mine, &src, 0, |b| {
            thread::scope(|s| {
                for t in 0..3u64 {
                    let b = b.clone();
                    let src = &src;
                    s.spawn(move || {
                        // Each from its own place, across both stripes.
                        for k in 0..8u64 {
                            let at = (t * 11_000 + k * 10_000) % 90_000;
                            let got = b.view(at, 9_000, <[u8]>::to_vec).expect("in range");
                            assert_eq!(got, src[at as usize..at as usize + 9_000]);
                        }
                    });
                }
            });
        });
        assert_eq!(mine, src);
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
