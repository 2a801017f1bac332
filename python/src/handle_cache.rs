//! The int objects of recently opened rooms' handles, so that a handle passed back from
//! Python is converted by one int comparison instead of a 128-bit conversion.
//!
//! ## Why
//!
//! A handle is a 128-bit Python int. Under the stable ABI (abi3) the only exact way to
//! read one is a shift that allocates a new int for the high half (`PyNumber_Rshift`):
//! about 40 ns, paid on every `begin_transfer`, `abort` and `quiesce`, 11 times in a
//! typical lifecycle (measured: `python/bench/RESULTS.md`).
//!
//! ## How
//!
//! `open` remembers the int it returns, with its value, in the slot of its room index (a
//! direct-mapped cache of at most [`MAX_SLOTS`] slots). To read a handle, the low 64 bits
//! (one allocation-free call) give the room index and so the slot; if the slot's int is
//! **equal** to the argument, the slot's value is the argument's value. Equality, not
//! identity: an ACK that arrives over the wire is a new int object of the same value, and
//! it hits too. Anything else (another room's handle in the slot, a stale handle whose room
//! was reopened, a forged or corrupted int, an int subclass) takes the exact slow path.
//!
//! The cache never decides anything: a hit yields exactly the int's value, which the core
//! then checks like any other (keyed check, generation). A stale handle that still hits
//! (its room not reopened yet) is refused as stale by the core, as before.
//!
//! ## Locking
//!
//! A slot is borrowed only for a comparison of two exact ints or a replacement (C code that
//! runs no Python code and cannot re-enter the table). On an interpreter with a GIL that
//! borrow is protected by the GIL itself: every caller is attached, and attached threads
//! hold the GIL one at a time ([`SlotCell`]). On a free-threaded interpreter each slot has
//! a `Mutex` instead (uncontended unless two threads read handles of the same slot).

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt};

use kvfence::RoomHandle;

/// At most this many slots (~48 bytes each): enough for every room a scheduler has in
/// flight; a larger table only sees more misses (exact, just slower).
pub const MAX_SLOTS: usize = 4096;

/// A handle int `open` returned, and its value.
struct Cached {
    int: Py<PyInt>,
    wire: u128,
}

/// One slot's contents, borrowed by [`SlotCell::with`] while attached.
#[cfg(not(Py_GIL_DISABLED))]
struct SlotCell(std::cell::UnsafeCell<Option<Cached>>);

// SAFETY: the contents are reached only through `with`, which takes a `Python` token: the
// caller is attached, which on this build (an interpreter with a GIL; the cfg above) means
// it holds the GIL, and only one thread holds it at a time. `Py<PyInt>` is `Send`.
#[cfg(not(Py_GIL_DISABLED))]
unsafe impl Sync for SlotCell {}

#[cfg(not(Py_GIL_DISABLED))]
impl SlotCell {
    fn new() -> SlotCell {
        SlotCell(std::cell::UnsafeCell::new(None))
    }

    /// Runs `f` on the slot. `f` must not run Python code (it could release the GIL, or
    /// re-enter the cache).
    #[inline]
    fn with<R>(&self, _py: Python<'_>, f: impl FnOnce(&mut Option<Cached>) -> R) -> R {
        // SAFETY: we hold the GIL (see `Sync` above) and `f` runs no Python code, so no
        // other thread and no re-entrant call can borrow the slot until `f` returns: this
        // `&mut` is the only reference.
        f(unsafe { &mut *self.0.get() })
    }
}

/// Free-threaded build: no GIL to lean on, so a mutex per slot.
#[cfg(Py_GIL_DISABLED)]
struct SlotCell(std::sync::Mutex<Option<Cached>>);

#[cfg(Py_GIL_DISABLED)]
impl SlotCell {
    fn new() -> SlotCell {
        SlotCell(std::sync::Mutex::new(None))
    }

    #[inline]
    fn with<R>(&self, _py: Python<'_>, f: impl FnOnce(&mut Option<Cached>) -> R) -> R {
        f(&mut self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()))
    }
}

/// See the module docs.
pub struct HandleCache {
    slots: Box<[SlotCell]>,
    mask: usize,
}

impl HandleCache {
    /// A cache for a table of `rooms` rooms.
    pub fn new(rooms: usize) -> HandleCache {
        let n = rooms.clamp(1, MAX_SLOTS).next_power_of_two();
        HandleCache {
            slots: (0..n).map(|_| SlotCell::new()).collect(),
            mask: n - 1,
        }
    }

    fn slot(&self, low: u64) -> &SlotCell {
        let index = RoomHandle::from_wire(u128::from(low)).index();
        &self.slots[index & self.mask]
    }

    /// The int for a handle `open` just made; remembered for [`HandleCache::read`]. A
    /// failed allocation is `Err` (`MemoryError`), not a panic, and remembers nothing.
    pub fn remember<'py>(
        &self,
        py: Python<'py>,
        handle: RoomHandle,
    ) -> PyResult<Bound<'py, PyInt>> {
        let wire = handle.to_wire();
        let int = int_from_wire(py, wire)?;
        let new = Cached {
            int: int.clone().unbind(),
            wire,
        };
        let old = self.slot(wire as u64).with(py, |slot| slot.replace(new));
        // Dropped (decref'd) after the slot's borrow ended.
        drop(old);
        Ok(int)
    }

    /// The int for `handle`: the one `open` returned, if its slot still holds it (no
    /// allocation; the dicts an engine keys by handle then compare by identity), else a
    /// new int of the same value. A failed allocation is `Err` (`MemoryError`), not a
    /// panic.
    pub fn int_of<'py>(&self, py: Python<'py>, handle: RoomHandle) -> PyResult<Bound<'py, PyInt>> {
        let wire = handle.to_wire();
        // `clone_ref` is an incref: no Python code runs while the slot is borrowed.
        let cached = self.slot(wire as u64).with(py, |slot| {
            slot.as_ref()
                .filter(|c| c.wire == wire)
                .map(|c| c.int.clone_ref(py))
        });
        match cached {
            Some(int) => Ok(int.into_bound(py)),
            None => int_from_wire(py, wire),
        }
    }

    /// Reads a handle: any int but a bool (`TypeError`: a bool is never a handle); one
    /// outside `range(2**128)` is `OverflowError` (the caller maps it to `InvalidHandle`).
    ///
    /// Only an exact int can hit (a bool is not one, nor is any other subclass), so the
    /// cache never sees a bool; the exact path refuses it before converting.
    #[inline]
    pub fn read(&self, h: &Bound<'_, PyAny>) -> PyResult<RoomHandle> {
        if let Ok(int) = h.cast_exact::<PyInt>() {
            if let Some(wire) = self.hit(int) {
                return Ok(RoomHandle::from_wire(wire));
            }
        } else if h.is_instance_of::<PyBool>() {
            return Err(PyTypeError::new_err(
                "a room handle must be an int, not bool",
            ));
        }
        h.extract::<u128>().map(RoomHandle::from_wire)
    }

    /// The value of `int` if the cache holds an int equal to it.
    #[inline]
    fn hit(&self, int: &Bound<'_, PyInt>) -> Option<u128> {
        // SAFETY: `int` is a live exact int (borrowed for this call) and the thread is
        // attached (the `Bound` proves it). For an int this never fails (it keeps the low
        // 64 bits of any value, negative ones included; the comparison below rejects
        // those), so there is no error to fetch.
        let low = unsafe { pyo3::ffi::PyLong_AsUnsignedLongLongMask(int.as_ptr()) };
        self.slot(low).with(int.py(), |slot| {
            let cached = slot.as_ref()?;
            if mutant!(kvfence_py_cache_trusts_low_bits) {
                // MUTATION (test-only): a slot whose handle has the same low bits is a hit.
                return (cached.wire as u64 == low).then_some(cached.wire);
            }
            // SAFETY: both are live exact ints (the slot's is owned by the slot, which we
            // hold); comparing two exact ints is `long_richcompare`, pure C: no Python code
            // runs. It cannot fail for two ints; if it ever did (-1), the error is cleared
            // and the exact path decides.
            let equal = unsafe {
                let equal = pyo3::ffi::PyObject_RichCompareBool(
                    cached.int.as_ptr(),
                    int.as_ptr(),
                    pyo3::ffi::Py_EQ,
                );
                if equal < 0 {
                    pyo3::ffi::PyErr_Clear();
                }
                equal
            };
            (equal == 1).then_some(cached.wire)
        })
    }
}

/// A new int of value `wire`. PyO3's `u128` conversion does the same under the stable ABI
/// (the high half shifted, or'ed with the low half) but panics if an allocation fails;
/// here that is `Err` (`MemoryError`).
fn int_from_wire(py: Python<'_>, wire: u128) -> PyResult<Bound<'_, PyInt>> {
    use pyo3::ffi;
    let owned = |p: *mut ffi::PyObject| {
        // SAFETY: `p` is what a C API call below just returned: a new reference, or null
        // with an exception set (which this makes `Err`); we are attached (`py`).
        unsafe { Bound::from_owned_ptr_or_err(py, p) }
    };
    // SAFETY: we are attached; the call takes a plain integer.
    let low = owned(unsafe { ffi::PyLong_FromUnsignedLongLong(wire as u64) })?;
    let high = (wire >> 64) as u64;
    let int = if high == 0 {
        low
    } else {
        // SAFETY: as above.
        let high = owned(unsafe { ffi::PyLong_FromUnsignedLongLong(high) })?;
        // SAFETY: as above (64 is one of CPython's preallocated small ints).
        let shift = owned(unsafe { ffi::PyLong_FromLong(64) })?;
        // SAFETY: both operands are live ints owned by the `Bound`s above.
        let shifted = owned(unsafe { ffi::PyNumber_Lshift(high.as_ptr(), shift.as_ptr()) })?;
        // SAFETY: both operands are live ints owned by the `Bound`s above.
        owned(unsafe { ffi::PyNumber_Or(shifted.as_ptr(), low.as_ptr()) })?
    };
    // SAFETY: every value above is an exact int (`PyLong_From*`, and `<<`, `|` of ints).
    Ok(unsafe { int.cast_into_unchecked() })
}
