//! Python bindings of kvfence: the native module `kvfence._kvfence`.
//!
//! A thin layer over the Rust core: every method converts its arguments, calls one
//! [`RoomTable`] method and converts the result. It adds no protocol logic; the only state
//! it keeps besides the table is the list of releases that a call returned directly (with
//! `release_queue=False`) or that a drain took but could not hand to Python (an allocation
//! failed), so that every release reaches `drain_released()` exactly once.
//!
//! Arguments: ids and counts are ints but never bools (`TypeError`), sequences of ids are
//! iterables but never a str, bytes or bytearray (`TypeError`). Reprs are Python syntax.
//!
//! Threading: the classes are frozen and `Sync` (the table is lock-free), so every method
//! may be called from any Python thread. Calls that can block or scan (the waits,
//! `fence_rank`, `readmit_rank`, `stats`, construction) run detached from the interpreter
//! (`py.detach`): other Python threads run meanwhile.

use kvfence::{
    Config, Error, Outcome, Phase, Quiesced, Reason, Released, RoomHandle, RoomStatus, RoomTable,
    TransferToken,
};
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{
    PyBool, PyByteArray, PyBytes, PyDict, PyInt, PyList, PyModule, PyString, PyTuple,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

/// Whether the binding's test-only mutation `$name` (a `kvfence_py_*` cfg) is on: compiled
/// in with `--cfg $name`, or, in a `--cfg kvfence_py_mutants` build (all of them in one
/// build, `scripts/python.sh --mutations`), chosen at run time by the environment variable
/// `KVFENCE_PY_MUTANT=$name`. `false` in a normal build, folded away at compile time.
macro_rules! mutant {
    ($name:ident) => {
        (cfg!($name) || $crate::mutant_chosen(stringify!($name)))
    };
}

/// The `KVFENCE_PY_MUTANT` of a `--cfg kvfence_py_mutants` build, read once; an unknown
/// name panics (a typo must not quietly test the correct code).
#[cfg(kvfence_py_mutants)]
fn mutant_chosen(name: &str) -> bool {
    const NAMES: [&str; 5] = [
        "kvfence_py_cache_trusts_low_bits",
        "kvfence_py_truncating_items",
        "kvfence_py_drain_loses",
        "kvfence_py_open_leaks_room",
        "kvfence_py_queue_holds_nothing",
    ];
    static CHOSEN: OnceLock<Option<&'static str>> = OnceLock::new();
    let chosen = CHOSEN.get_or_init(|| {
        let value = std::env::var("KVFENCE_PY_MUTANT").unwrap_or_default();
        if value.is_empty() {
            return None;
        }
        match NAMES.iter().find(|n| **n == value) {
            Some(n) => Some(n),
            None => panic!(
                "KVFENCE_PY_MUTANT={value:?} is not a mutation of this build; known: {NAMES:?}"
            ),
        }
    });
    *chosen == Some(name)
}
/// No run-time mutations in this build.
#[cfg(not(kvfence_py_mutants))]
#[inline(always)]
const fn mutant_chosen(_: &str) -> bool {
    false
}

mod handle_cache;
use handle_cache::HandleCache;

// ---------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------

/// `kvfence._errors`, where the exception classes are defined (in Python, so that they can
/// derive from both `kvfence.Error` and `ValueError`).
static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// An attribute set on a raised exception (`e.rank`, `e.phase`, `e.requested`).
enum Attr {
    None,
    Int(&'static str, u64),
    Str(&'static str, &'static str),
}

/// An instance of `kvfence.<class>(message)` with `attr` set, as a `PyErr`.
fn raise(py: Python<'_>, class: &str, message: String, attr: Attr) -> PyErr {
    let build = || -> PyResult<PyErr> {
        let module =
            ERRORS.get_or_try_init(py, || py.import("kvfence._errors").map(Bound::unbind))?;
        let instance = module.bind(py).getattr(class)?.call1((message,))?;
        match attr {
            Attr::None => {}
            Attr::Int(name, value) => instance.setattr(name, value)?,
            Attr::Str(name, value) => instance.setattr(name, value)?,
        }
        Ok(PyErr::from_value(instance))
    };
    build().unwrap_or_else(|e| e)
}

/// The Python exception for a refusal of the core.
fn to_py(py: Python<'_>, e: Error) -> PyErr {
    let (class, attr) = match e {
        Error::InvalidConfig { .. } => ("InvalidConfig", Attr::None),
        Error::UnknownRoom { .. } | Error::InvalidHandle => ("InvalidHandle", Attr::None),
        Error::StaleHandle => ("StaleHandle", Attr::None),
        Error::RoomClosed { phase } => ("RoomClosed", Attr::Str("phase", phase_str(phase))),
        Error::AlreadyAborted => ("AlreadyAborted", Attr::Str("phase", "aborting")),
        Error::AlreadyFinished => ("AlreadyFinished", Attr::Str("phase", "draining")),
        Error::InvalidRank { rank } => ("InvalidRank", Attr::Int("rank", rank.into())),
        Error::TooManyWriters { .. } => ("TooManyWriters", Attr::None),
        Error::DuplicateWriter { rank } => ("DuplicateWriter", Attr::Int("rank", rank.into())),
        Error::RankNotInRoom { rank } => ("RankNotInRoom", Attr::Int("rank", rank.into())),
        Error::RankFenced { rank } => ("RankFenced", Attr::Int("rank", rank.into())),
        Error::TooManyFenced { .. } => ("TooManyFenced", Attr::None),
        Error::WrongMode { .. } => ("WrongMode", Attr::None),
        Error::TooManyPages { .. } | Error::TooManyPagesInRoom => ("TooManyPages", Attr::None),
        Error::InvalidToken => ("InvalidToken", Attr::None),
        Error::TooManyTokens | Error::TooManyTransfers => ("TooManyTransfers", Attr::None),
        Error::RoomTableFull => ("TableFull", Attr::None),
        Error::PoolExhausted { requested } => {
            ("PoolExhausted", Attr::Int("requested", requested as u64))
        }
        Error::OutOfMemory { .. } => ("OutOfMemory", Attr::None),
        // Variants added later (`Error` is non-exhaustive): the base class.
        _ => ("Error", Attr::None),
    };
    raise(py, class, e.to_string(), attr)
}

/// `Result<T, kvfence::Error>` to `PyResult<T>`.
trait IntoPy<T> {
    fn py(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, Error> {
    #[inline]
    fn py(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, e))
    }
}

// ---------------------------------------------------------------------------------------
// Argument conversion
// ---------------------------------------------------------------------------------------

/// `TypeError` if `v` is a bool: `True` is an int subclass, but never an id or a count
/// (`quiesce(h, True)` would ACK rank 1). Only the general paths call it: the fast paths
/// read exact ints only, and a bool is not one.
#[inline]
fn no_bool(v: &Bound<'_, PyAny>, what: &str) -> PyResult<()> {
    if v.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "{what} must be an int, not bool"
        )));
    }
    Ok(())
}

/// A rank id: an int in `range(2**32)`, not a bool (`2**32 - 1` is refused by the core).
#[inline]
fn rank(r: &Bound<'_, PyAny>) -> PyResult<u32> {
    // SAFETY: `r` is live and we are attached (the `Bound` proves both).
    if let Some(rank) = unsafe { exact_u32(r.as_ptr()) } {
        return Ok(rank);
    }
    no_bool(r, "a rank id")?;
    match r.extract::<u32>() {
        Ok(rank) => Ok(rank),
        Err(e) if e.is_instance_of::<PyOverflowError>(r.py()) => Err(raise(
            r.py(),
            "InvalidRank",
            format!("{r} is not a rank id: ranks are ints in range(2**32 - 1)"),
            Attr::None,
        )),
        Err(e) => Err(e),
    }
}

/// The value of `item` if it is an exact int in `range(2**32)`, read without running any
/// Python code (`PyLong_AsSsize_t` of an exact int calls no `__index__`). A bool is not an
/// exact int: it always takes the caller's general path, which refuses it.
///
/// # Safety
///
/// `item` must point to a live object and the thread must be attached.
#[inline]
unsafe fn exact_u32(item: *mut ffi::PyObject) -> Option<u32> {
    // SAFETY: `item` is live and we are attached (the caller's contract).
    unsafe {
        if ffi::PyLong_CheckExact(item) == 0 {
            return None;
        }
        // `PyLong_AsSsize_t`, not `PyLong_AsLong`: one call instead of two (the latter wraps
        // `PyLong_AsLongAndOverflow`), same result for an exact int.
        let v = ffi::PyLong_AsSsize_t(item);
        if v == -1 && !ffi::PyErr_Occurred().is_null() {
            // Too large for a Py_ssize_t: leave the error to the exact path.
            ffi::PyErr_Clear();
            return None;
        }
        if mutant!(kvfence_py_truncating_items) {
            // MUTATION (test-only): keep the low 32 bits of any value.
            return Some(v as u32);
        }
        u32::try_from(v).ok()
    }
}

/// `exact_u32` of `list[i]` (`i` in bounds or an `IndexError`), read through a borrowed
/// reference: no reference counting (two calls into libpython per item under the stable
/// ABI).
#[cfg(not(Py_GIL_DISABLED))]
#[inline]
fn list_exact_u32(list: &Bound<'_, PyList>, i: usize) -> PyResult<Option<u32>> {
    // SAFETY: `PyList_GetItem` checks `i` and lends a live item (a borrowed reference,
    // valid while the list holds it). The GIL is held throughout (this build has one) and
    // `exact_u32` runs no Python code, so no thread and no `__del__` can change the list
    // before it returns.
    unsafe {
        let item = ffi::PyList_GetItem(list.as_ptr(), i as ffi::Py_ssize_t);
        if item.is_null() {
            return Err(PyErr::fetch(list.py()));
        }
        Ok(exact_u32(item))
    }
}

/// Free-threaded build: another thread may change the list at any time, so the item is
/// read as a strong reference.
#[cfg(Py_GIL_DISABLED)]
#[inline]
fn list_exact_u32(list: &Bound<'_, PyList>, i: usize) -> PyResult<Option<u32>> {
    let item = list.get_item(i)?;
    // SAFETY: `item` is a strong reference and we are attached.
    Ok(unsafe { exact_u32(item.as_ptr()) })
}

/// The items of `items` (any iterable but a str, bytes or bytearray: `what` names it in the
/// error) as `u32`s: `f` converts (or refuses) each one. Fast path for the list or tuple an
/// engine passes: exact ints in `range(2**32)` are read in place (no iterator, no reference
/// counting), into a vector of the right size: about 3x faster than iterating on 16 items.
/// Anything else goes through `f`, which gives the error.
#[inline]
fn collect_u32(
    items: &Bound<'_, PyAny>,
    what: &str,
    mut f: impl FnMut(&Bound<'_, PyAny>) -> PyResult<u32>,
) -> PyResult<Vec<u32>> {
    if let Ok(list) = items.cast::<PyList>() {
        let mut len = list.len();
        let mut out = Vec::with_capacity(len);
        let mut i = 0;
        while i < len {
            let fast = list_exact_u32(list, i)?;
            out.push(match fast {
                Some(v) => v,
                None => {
                    let v = f(&list.get_item(i)?)?;
                    // `f` may have run Python code (an `__index__`) that changed the list.
                    len = list.len();
                    v
                }
            });
            i += 1;
        }
        Ok(out)
    } else if let Ok(tuple) = items.cast::<PyTuple>() {
        let mut out = Vec::with_capacity(tuple.len());
        for item in tuple.iter_borrowed() {
            // SAFETY: the tuple (immutable) holds `item` for the whole loop.
            out.push(match unsafe { exact_u32(item.as_ptr()) } {
                Some(v) => v,
                None => f(&item)?,
            });
        }
        Ok(out)
    } else {
        // Iterables of ints, or of one-char strs, that are never meant as ids: refused
        // whole, as `str.join` refuses bytes (`b"\x01"` is not page 1).
        if items.is_instance_of::<PyBytes>()
            || items.is_instance_of::<PyByteArray>()
            || items.is_instance_of::<PyString>()
        {
            return Err(PyTypeError::new_err(format!(
                "{what} must be an iterable of ints, not {}",
                items.get_type().name()?
            )));
        }
        let mut out = Vec::new();
        for item in items.try_iter()? {
            out.push(f(&item?)?);
        }
        Ok(out)
    }
}

/// Writer ranks: any iterable of rank ids.
fn ranks(writers: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    collect_u32(writers, "writers", rank)
}

/// The engine's page ids: any iterable of ints in `range(2**32)` (not bools).
fn page_ids(pages: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
    if pages.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(
            "gate mode: pages is a sequence of the engine's page ids (or None), not a count",
        ));
    }
    collect_u32(pages, "pages", |p| {
        no_bool(p, "a page id")?;
        match p.extract::<u32>() {
            Ok(id) => Ok(id),
            Err(e) if e.is_instance_of::<PyOverflowError>(p.py()) => Err(PyValueError::new_err(
                format!("page id {p} is out of range: page ids are ints in range(2**32)"),
            )),
            Err(e) => Err(e),
        }
    })
}

/// A non-negative count, not a bool (`what` names it in the error).
fn count(n: &Bound<'_, PyAny>, what: &str) -> PyResult<usize> {
    no_bool(n, what)?;
    if !n.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{what} must be an int, not {}",
            n.get_type().name()?
        )));
    }
    n.extract::<usize>().map_err(|e| {
        if e.is_instance_of::<PyOverflowError>(n.py()) {
            PyValueError::new_err(format!("{what} must be a non-negative int, got {n}"))
        } else {
            e
        }
    })
}

/// A timeout in seconds: `None` or infinity waits for ever; negative or NaN is refused, and
/// so is a bool (`wait_released(h, True)` is a slip, not one second).
fn timeout_arg(timeout: Option<&Bound<'_, PyAny>>) -> PyResult<Option<Duration>> {
    let timeout = match timeout {
        None => None,
        Some(t) => {
            no_bool(t, "timeout")?;
            Some(t.extract::<f64>()?)
        }
    };
    match timeout {
        None => Ok(None),
        Some(s) if s.is_nan() || s < 0.0 => Err(PyValueError::new_err(
            "timeout must be a non-negative number of seconds, or None",
        )),
        Some(s) => Ok(Duration::try_from_secs_f64(s).ok()),
    }
}

/// The longest one detached wait runs before it comes back to check for signals
/// (KeyboardInterrupt) and the deadline.
const WAIT_SLICE: Duration = Duration::from_millis(100);

/// Waits (detached from the interpreter) until `step(slice)` says done or the timeout runs
/// out; checks for signals between slices.
fn wait_loop<F>(py: Python<'_>, timeout: Option<Duration>, step: F) -> PyResult<bool>
where
    F: Fn(Duration) -> Result<bool, Error> + Sync,
{
    let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
    loop {
        let slice = match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()).min(WAIT_SLICE),
            None => WAIT_SLICE,
        };
        if py.detach(|| step(slice)).py(py)? {
            return Ok(true);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Ok(false);
        }
        py.check_signals()?;
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A bool as Python writes it (reprs are Python syntax).
fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}

fn phase_str(phase: Phase) -> &'static str {
    match phase {
        Phase::Free => "free",
        Phase::Owned => "owned",
        Phase::Aborting => "aborting",
        Phase::Draining => "draining",
    }
}

/// Every word a call returns (release reasons, `quiesce` outcomes, phases), as interned
/// Python strings made when the module is imported, so that no call allocates one after it
/// changed the table (`intern!` would panic if that allocation failed; [`word`] falls back
/// to a fallible intern only if the import did not make them).
static WORDS: PyOnceLock<[Py<PyString>; Word::ALL.len()]> = PyOnceLock::new();

/// The words of [`WORDS`], in its order.
#[derive(Clone, Copy)]
enum Word {
    Finished,
    Aborted,
    Quarantined,
    Recorded,
    Duplicate,
    Released,
    Stale,
    Free,
    Owned,
    Aborting,
    Draining,
}

impl Word {
    const ALL: [Word; 11] = [
        Word::Finished,
        Word::Aborted,
        Word::Quarantined,
        Word::Recorded,
        Word::Duplicate,
        Word::Released,
        Word::Stale,
        Word::Free,
        Word::Owned,
        Word::Aborting,
        Word::Draining,
    ];

    fn text(self) -> &'static str {
        match self {
            Word::Finished => reason_str(Reason::Finished),
            Word::Aborted => reason_str(Reason::Aborted),
            Word::Quarantined => reason_str(Reason::Quarantined),
            Word::Recorded => "recorded",
            Word::Duplicate => "duplicate",
            Word::Released => "released",
            Word::Stale => "stale",
            Word::Free => phase_str(Phase::Free),
            Word::Owned => phase_str(Phase::Owned),
            Word::Aborting => phase_str(Phase::Aborting),
            Word::Draining => phase_str(Phase::Draining),
        }
    }

    fn of_reason(reason: Reason) -> Word {
        match reason {
            Reason::Finished => Word::Finished,
            Reason::Aborted => Word::Aborted,
            Reason::Quarantined => Word::Quarantined,
        }
    }

    fn of_phase(phase: Phase) -> Word {
        match phase {
            Phase::Free => Word::Free,
            Phase::Owned => Word::Owned,
            Phase::Aborting => Word::Aborting,
            Phase::Draining => Word::Draining,
        }
    }
}

/// The interned string of `w` (see [`WORDS`]): a shared object, no allocation.
fn word(py: Python<'_>, w: Word) -> PyResult<Bound<'_, PyString>> {
    if let Some(words) = WORDS.get(py) {
        return Ok(words[w as usize].bind(py).clone());
    }
    interned(py, w.text())
}

/// `word` as an interned Python string; a failed allocation is `Err`, not a panic.
fn interned<'py>(py: Python<'py>, word: &str) -> PyResult<Bound<'py, PyString>> {
    let c = std::ffi::CString::new(word).map_err(|e| PyValueError::new_err(e.to_string()))?;
    // SAFETY: we are attached and `c` is a NUL-terminated string; the call returns a new
    // reference or null with an exception set (`from_owned_ptr_or_err` makes that `Err`).
    let s =
        unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyUnicode_InternFromString(c.as_ptr()))? };
    // SAFETY: `PyUnicode_InternFromString` returns a str.
    Ok(unsafe { s.cast_into_unchecked() })
}

fn reason_str(reason: Reason) -> &'static str {
    match reason {
        Reason::Finished => "finished",
        Reason::Aborted => "aborted",
        Reason::Quarantined => "quarantined",
    }
}

// ---------------------------------------------------------------------------------------
// Classes
// ---------------------------------------------------------------------------------------

/// The table and the releases it handed to the binding that Python has not received yet.
struct Inner {
    table: RoomTable,
    /// Releases for the next `drain_released()`: the ones calls returned directly (only
    /// with `release_queue=False`), and the ones a drain took but could not hand to Python
    /// (an allocation failed). Never locked while Python code may run (an allocation can
    /// run the garbage collector, and a collected `Transfer` calls `keep`).
    direct: Mutex<Vec<Released>>,
    /// The ints of handles `open` returned, to read them back fast.
    handles: HandleCache,
}

impl Inner {
    /// Keeps a release a call returned, for `drain_released()`.
    #[inline]
    fn keep(&self, released: Option<Released>) {
        if let Some(r) = released {
            lock(&self.direct).push(r);
        }
    }

    /// Every release waiting for Python: the binding's own, then the table's queue (one
    /// pass over it).
    fn take_all(&self) -> Vec<Released> {
        let mut taken = std::mem::take(&mut *lock(&self.direct));
        taken.reserve(self.table.queued_releases());
        self.table.drain_released(&mut taken);
        taken
    }

    /// Gives back releases taken but not handed to Python: the next drain returns them.
    fn put_back(&self, mut releases: Vec<Released>) {
        let mut direct = lock(&self.direct);
        releases.append(&mut direct);
        *direct = releases;
    }

    /// The `Released` objects of `taken`, in a new list; all or nothing: if an allocation
    /// fails, `taken` is untouched (the caller puts it back).
    ///
    /// Every fallible step (each object, then the list) comes first, while the objects are
    /// still empty shells and `taken` still owns every release; then each release's pages
    /// move into its object, which cannot fail.
    fn to_list<'py>(py: Python<'py>, taken: &mut Vec<Released>) -> PyResult<Bound<'py, PyList>> {
        let len = ffi::Py_ssize_t::try_from(taken.len())
            .map_err(|_| PyOverflowError::new_err("too many releases for one list"))?;
        let mut shells = Vec::with_capacity(taken.len());
        for r in taken.iter() {
            shells.push(Bound::new(py, PyReleased::shell(r))?);
        }
        // The list last: from here nothing allocates in Python (no garbage collection can
        // run), so no Python code ever sees its slots before they are filled.
        // SAFETY: we are attached; `PyList_New` returns a new reference or null with an
        // exception set, which `from_owned_ptr_or_err` turns into `Err`. (Not
        // `PyList::new`, which panics when the list cannot be allocated.)
        let list = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyList_New(len))? };
        // Nothing below can fail: the releases move into their objects, the objects into
        // the list's slots.
        for (i, (shell, r)) in shells.into_iter().zip(taken.drain(..)).enumerate() {
            shell.get().fill(r);
            // SAFETY: `list` is a new list of `len` slots, all still empty, and `i < len`:
            // `PyList_SetItem` stores the object and steals our reference (it cannot fail
            // for a list and an index in range).
            unsafe { ffi::PyList_SetItem(list.as_ptr(), i as ffi::Py_ssize_t, shell.into_ptr()) };
        }
        // SAFETY: `PyList_New` made a list.
        Ok(unsafe { list.cast_into_unchecked() })
    }
}

/// A room's release: its lifecycle is over and nothing can write its pages any more
/// (unless ``reason == "quarantined"``). Delivered exactly once, by ``drain_released()``.
///
/// Attributes: ``handle`` (int, now stale), ``token`` (int: the ``token`` given to
/// ``open``; 0 in pool mode), ``pages`` (list of page ids) and ``reason``: ``"finished"``,
/// ``"aborted"`` or ``"quarantined"``. Gate mode: free ``pages`` with the engine's own
/// allocator now, unless quarantined: a quarantined room's pages must **never** be freed
/// or reused. Pool mode: the pages are already back in the pool (quarantined ones never).
#[pyclass(frozen, module = "kvfence._kvfence", name = "Released")]
struct PyReleased {
    /// The handle of the lifecycle that ended (stale from now on).
    #[pyo3(get)]
    handle: u128,
    /// The token the room was opened with (gate mode; 0 in pool mode).
    #[pyo3(get)]
    token: u64,
    /// The room's page ids: set once, right after the object was allocated (see `fill`).
    pages: OnceLock<Vec<u32>>,
    /// ``"finished"``, ``"aborted"`` or ``"quarantined"`` (never free those pages).
    #[pyo3(get)]
    reason: &'static str,
}

impl PyReleased {
    /// `r`'s object without its pages: made (allocated in Python, which may fail) while
    /// the caller still owns `r`, so that a failed allocation loses nothing.
    fn shell(r: &Released) -> PyReleased {
        PyReleased {
            handle: r.handle.to_wire(),
            token: r.token,
            pages: OnceLock::new(),
            reason: reason_str(r.reason),
        }
    }

    /// Moves `r`'s pages into its shell; cannot fail. From here the object is the release.
    fn fill(&self, r: Released) {
        debug_assert_eq!(self.handle, r.handle.to_wire());
        // A shell is filled once, by the call that made it.
        let _ = self.pages.set(r.pages);
    }

    /// One release as a `Released` object, or `Err` with `r` handed back untouched.
    fn new_bound(py: Python<'_>, r: Released) -> Result<Bound<'_, PyReleased>, (PyErr, Released)> {
        match Bound::new(py, PyReleased::shell(&r)) {
            Ok(obj) => {
                obj.get().fill(r);
                Ok(obj)
            }
            Err(e) => Err((e, r)),
        }
    }

    fn page_list(&self) -> &[u32] {
        self.pages.get().map_or(&[], Vec::as_slice)
    }
}

#[pymethods]
impl PyReleased {
    /// The room's page ids (a new list on each access).
    #[getter]
    fn pages(&self) -> Vec<u32> {
        self.page_list().to_vec()
    }

    fn __repr__(&self) -> String {
        format!(
            "Released(handle={:#x}, token={}, pages={:?}, reason='{}')",
            self.handle,
            self.token,
            self.page_list(),
            self.reason
        )
    }
}

/// One transfer in flight (``RoomTable.begin_transfer``): while it is not ended the room
/// keeps its pages, whatever happens to the request.
///
/// End it exactly once: ``complete()`` (every byte landed) or ``fail()`` (the transfer
/// engine reported an error or a timeout: bytes may still land, so the room stays held
/// until ``peer`` is fenced or the room is quarantined). Ending it twice raises
/// ``InvalidToken`` and changes nothing.
///
/// As a context manager, a normal exit completes it and an exception fails it (the
/// exception propagates); nothing happens on exit if it was already ended. A transfer that
/// is garbage-collected without being ended is failed, like a dropped Rust guard.
#[pyclass(frozen, module = "kvfence._kvfence", name = "Transfer")]
struct PyTransfer {
    inner: Arc<Inner>,
    /// The token's wire form.
    #[pyo3(get)]
    token: u128,
    /// The room's handle.
    #[pyo3(get)]
    handle: u128,
    /// The peer rank given to ``begin_transfer`` (or ``None``).
    #[pyo3(get)]
    peer: Option<u32>,
    ended: AtomicBool,
}

impl PyTransfer {
    fn end(&self, py: Python<'_>, outcome: Outcome) -> PyResult<()> {
        let released = self
            .inner
            .table
            .end(TransferToken::from_wire(self.token), outcome)
            .py(py)?;
        self.ended.store(true, Ordering::Relaxed);
        self.inner.keep(released);
        Ok(())
    }
}

#[pymethods]
impl PyTransfer {
    /// Ends the transfer as completed: every byte landed. Its hold on the room is dropped
    /// (if it was the last of a closing room, the release goes to ``drain_released()``).
    ///
    /// Raises ``InvalidToken`` if the transfer was already ended.
    fn complete(&self, py: Python<'_>) -> PyResult<()> {
        self.end(py, Outcome::Completed)
    }

    /// Ends the transfer as failed: its outcome is unknown and bytes may still land, so the
    /// room stays held until ``peer`` is fenced (``fence_rank``) or the room is quarantined
    /// (``quarantine``). If that happened already, the hold is dropped now.
    ///
    /// Raises ``InvalidToken`` if the transfer was already ended.
    fn fail(&self, py: Python<'_>) -> PyResult<()> {
        self.end(py, Outcome::Failed)
    }

    /// Whether ``complete()`` or ``fail()`` has ended this transfer.
    #[getter]
    fn ended(&self) -> bool {
        self.ended.load(Ordering::Relaxed)
    }

    /// Returns the transfer itself.
    fn __enter__<'py>(slf: &Bound<'py, Self>) -> Bound<'py, Self> {
        slf.clone()
    }

    /// Completes the transfer on a normal exit, fails it on an exception (which
    /// propagates). Does nothing if the transfer was already ended.
    #[pyo3(signature = (exc_type, _exc_value, _traceback))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<&Bound<'_, PyAny>>,
        _exc_value: Option<&Bound<'_, PyAny>>,
        _traceback: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        if self.ended.load(Ordering::Relaxed) {
            return Ok(false);
        }
        match exc_type {
            None => self.end(py, Outcome::Completed)?,
            // Never mask the exception that is propagating.
            Some(_) => {
                let _ = self.end(py, Outcome::Failed);
            }
        }
        Ok(false)
    }

    fn __repr__(&self) -> String {
        let peer = match self.peer {
            Some(rank) => rank.to_string(),
            None => "None".to_owned(),
        };
        format!(
            "Transfer(token={:#x}, handle={:#x}, peer={peer}, ended={})",
            self.token,
            self.handle,
            py_bool(self.ended.load(Ordering::Relaxed))
        )
    }
}

impl Drop for PyTransfer {
    fn drop(&mut self) {
        // Not ended: failed, as a dropped Rust guard (the room stays held until the peer is
        // fenced or the room quarantined). The core refuses a second end, so this can
        // never count twice.
        // `&mut self`: nothing else can touch `ended` now.
        if !std::mem::replace(self.ended.get_mut(), true) {
            if let Ok(released) = self
                .inner
                .table
                .end(TransferToken::from_wire(self.token), Outcome::Failed)
            {
                self.inner.keep(released);
            }
        }
    }
}

/// A work queue whose every item holds a kvfence transfer on its room while it is being
/// processed: from the ``get`` that returns it until the next ``get``.
///
/// ``TransferQueue(queue, key="room")`` wraps ``queue`` (any object with ``get()`` and,
/// optionally, ``put(item)``), as a transfer worker's queue of per-room work items: each
/// ``get()`` first ends the transfer of the item taken before (completed: ``fail`` ends it
/// otherwise), then takes the next item from ``queue.get()`` and begins a transfer on the
/// room that ``handles[getattr(item, key)]`` names (``bind``). An idle worker blocked in
/// ``get()`` holds no room; every write the worker makes for an item happens inside that
/// item's transfer, whatever code makes it, so no write method needs a wrapper.
///
/// An item whose room is aborted or released is returned all the same, with no transfer:
/// the engine must skip it (``refused`` counts them); an item with no ``key`` attribute,
/// or whose key ``handles`` lacks, is returned with no transfer and not counted. ``None``
/// (a sentinel) is returned as is. Before ``bind`` (the table may come after the worker
/// starts) every item is returned with no transfer.
///
/// Meant for one worker thread (each worker its own queue); any thread may call ``fail``
/// or read the counters. The transfer of a queue that is garbage-collected while one is
/// open is failed, as a dropped ``Transfer`` is. Attributes it does not define are read
/// from ``queue``.
#[pyclass(frozen, module = "kvfence._kvfence", name = "TransferQueue")]
struct PyTransferQueue {
    /// The wrapped queue.
    #[pyo3(get)]
    queue: Py<PyAny>,
    /// Its ``get``.
    get: Py<PyAny>,
    /// The item attribute naming its room's key in ``handles``.
    key: Py<PyString>,
    state: Mutex<QueueState>,
}

/// What `TransferQueue` keeps between calls (never locked while Python code runs).
#[derive(Default)]
struct QueueState {
    /// What `bind` gave, once called.
    bound: Option<Binding>,
    /// The open transfer (its token's wire form) and its item's key.
    current: Option<(u128, Py<PyAny>)>,
    refused: u64,
    failed: u64,
}

/// A `TransferQueue`'s table, `handles` dict and `on_release` callable.
struct Binding {
    inner: Arc<Inner>,
    handles: Py<PyDict>,
    on_release: Option<Py<PyAny>>,
}

impl PyTransferQueue {
    /// Ends `current`'s transfer with `outcome`; returns the table, and `on_release` if
    /// releases now wait for `drain_released()`.
    fn end_current(
        &self,
        py: Python<'_>,
        outcome: Outcome,
        state: &mut QueueState,
    ) -> PyResult<Option<Py<PyAny>>> {
        let Some((token, _key)) = state.current.take() else {
            return Ok(None);
        };
        let Some(Binding {
            inner, on_release, ..
        }) = state.bound.as_ref()
        else {
            return Ok(None);
        };
        let released = inner
            .table
            .end(TransferToken::from_wire(token), outcome)
            .py(py)?;
        if outcome == Outcome::Failed {
            state.failed += 1;
        }
        inner.keep(released);
        let waiting = lock(&inner.direct).len() + inner.table.queued_releases() > 0;
        Ok(if waiting {
            on_release.as_ref().map(|f| f.clone_ref(py))
        } else {
            None
        })
    }
}

#[pymethods]
impl PyTransferQueue {
    #[new]
    #[pyo3(signature = (queue, key="room"))]
    fn new(queue: &Bound<'_, PyAny>, key: &str) -> PyResult<Self> {
        let py = queue.py();
        Ok(Self {
            get: queue.getattr("get")?.unbind(),
            queue: queue.clone().unbind(),
            key: PyString::intern(py, key).unbind(),
            state: Mutex::new(QueueState::default()),
        })
    }

    /// Binds the queue to ``table``: from now on each item's room is ``handles[key]`` (a
    /// dict the caller keeps current: key -> handle from ``table.open``), and
    /// ``on_release()`` (if given) is called, on the worker's thread, after a ``get`` or
    /// ``fail`` whose transfer's end left releases waiting for ``table.drain_released()``.
    ///
    /// Raises ``RuntimeError`` if the queue is bound already (a queue serves one table),
    /// ``TypeError`` if ``handles`` is not a dict.
    #[pyo3(signature = (table, handles, on_release=None))]
    fn bind(
        &self,
        table: &Bound<'_, PyRoomTable>,
        handles: &Bound<'_, PyDict>,
        on_release: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let new = Binding {
            inner: Arc::clone(&table.get().inner),
            handles: handles.clone().unbind(),
            on_release: on_release.map(|f| f.clone().unbind()),
        };
        let mut state = lock(&self.state);
        if state.bound.is_some() {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "this TransferQueue is bound to a table already",
            ));
        }
        state.bound = Some(new);
        Ok(())
    }

    /// Ends the transfer of the item taken before (completed), takes the next item from
    /// the wrapped queue (blocking as its ``get`` does, holding no room) and begins a
    /// transfer on the item's room. Returns the item.
    ///
    /// Raises what the wrapped ``get`` raises, and kvfence's ``TooManyTransfers`` or
    /// ``InvalidHandle`` (a transfer that could not begin for a room that is not closed:
    /// the item is not returned, so that it is never processed ungated).
    fn get(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let (on_release, bound) = {
            let mut state = lock(&self.state);
            let on_release = self.end_current(py, Outcome::Completed, &mut state)?;
            let bound = state
                .bound
                .as_ref()
                .map(|b| (Arc::clone(&b.inner), b.handles.clone_ref(py)));
            (on_release, bound)
        };
        if let Some(f) = on_release {
            f.call0(py)?;
        }
        let item = self.get.call0(py)?;
        let Some((inner, handles)) = bound else {
            return Ok(item);
        };
        let item_ref = item.bind(py);
        if item_ref.is_none() {
            return Ok(item);
        }
        let key = match item_ref.getattr(self.key.bind(py)) {
            Ok(key) => key,
            Err(e) if e.is_instance_of::<pyo3::exceptions::PyAttributeError>(py) => {
                return Ok(item);
            }
            Err(e) => return Err(e),
        };
        let Some(h) = handles.bind(py).get_item(&key)? else {
            return Ok(item);
        };
        let h = inner.handles.read(&h)?;
        match inner.table.begin(h, None) {
            Ok(token) if mutant!(kvfence_py_queue_holds_nothing) => {
                // Test-only mutation: the transfer ends at once, holding nothing while
                // the item is processed.
                let released = inner.table.end(token, Outcome::Completed);
                inner.keep(released.unwrap_or(None));
            }
            Ok(token) => lock(&self.state).current = Some((token.to_wire(), key.unbind())),
            Err(Error::StaleHandle | Error::RoomClosed { .. }) => lock(&self.state).refused += 1,
            Err(e) => return Err(to_py(py, e)),
        }
        Ok(item)
    }

    /// Fails the open transfer if its item's key equals ``key`` (a write of it failed:
    /// bytes may still land, so its room is never "drained"); returns whether it did.
    /// Calls ``on_release`` as ``get`` does.
    fn fail(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<bool> {
        // The comparison runs Python code (`__eq__`): not under the lock.
        let Some((token, current)) = lock(&self.state)
            .current
            .as_ref()
            .map(|(t, k)| (*t, k.clone_ref(py)))
        else {
            return Ok(false);
        };
        if !current.bind(py).eq(key)? {
            return Ok(false);
        }
        let on_release = {
            let mut state = lock(&self.state);
            if state.current.as_ref().map(|(t, _)| *t) != Some(token) {
                return Ok(false); // ended meanwhile (another thread's `get` or `fail`)
            }
            self.end_current(py, Outcome::Failed, &mut state)?
        };
        if let Some(f) = on_release {
            f.call0(py)?;
        }
        Ok(true)
    }

    /// The key of the item whose transfer is open, or ``None``.
    #[getter]
    fn current(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        lock(&self.state)
            .current
            .as_ref()
            .map(|(_, k)| k.clone_ref(py))
    }

    /// Items returned with no transfer because their room was aborted or released.
    #[getter]
    fn refused(&self) -> u64 {
        lock(&self.state).refused
    }

    /// Transfers ended by ``fail``.
    #[getter]
    fn failed(&self) -> u64 {
        lock(&self.state).failed
    }

    /// ``queue.put(item)``.
    fn put(&self, py: Python<'_>, item: &Bound<'_, PyAny>) -> PyResult<()> {
        self.queue.bind(py).call_method1("put", (item,))?;
        Ok(())
    }

    /// Any other attribute: the wrapped queue's.
    fn __getattr__(&self, py: Python<'_>, name: &Bound<'_, PyString>) -> PyResult<Py<PyAny>> {
        Ok(self.queue.bind(py).getattr(name)?.unbind())
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let (bound, current, refused, failed) = {
            let state = lock(&self.state);
            let current = state.current.as_ref().map(|(_, k)| k.clone_ref(py));
            (state.bound.is_some(), current, state.refused, state.failed)
        };
        // `repr` of the key runs Python code: not under the lock.
        let current = match current {
            Some(k) => k.bind(py).repr()?.to_string(),
            None => "None".to_owned(),
        };
        Ok(format!(
            "TransferQueue(bound={}, current={current}, refused={refused}, failed={failed})",
            py_bool(bound)
        ))
    }
}

impl Drop for PyTransferQueue {
    fn drop(&mut self) {
        // An open transfer: failed, as a dropped `Transfer` (its outcome is unknown).
        let state = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        if let (Some((token, _)), Some(b)) = (state.current.take(), &state.bound) {
            if let Ok(released) = b
                .inner
                .table
                .end(TransferToken::from_wire(token), Outcome::Failed)
            {
                b.inner.keep(released);
            }
        }
    }
}

/// The kvfence room table: one room per request, deciding when its KV-cache pages may be
/// reused.
///
/// ``RoomTable(rooms, pages=None, *, release_queue=True, max_fenced=256, max_tokens=None)``
///
/// * ``pages=None``: gate mode. The engine owns its pages: ``open`` takes the engine's page
///   ids and a ``token`` (its request slot), and a release hands both back.
/// * ``pages=N``: pool mode. kvfence owns a pool of ``N`` pages (ids ``0..N``): ``open``
///   claims a count of them, all or nothing.
///
/// Every release is delivered exactly once, through ``drain_released()`` (call it from the
/// scheduler loop; any thread may). ``release_queue`` chooses when a release hands the
/// room index (and pool pages) back to the table:
///
/// * ``True`` (default): at ``drain_released()``: the core's lock-free release queue. A room
///   is not reusable until its release is drained; ``wait_released``/``wait_idle`` end
///   once it is queued (then drain it: wait, then drain, on one thread).
/// * ``False``: at once, by the call that performed the release (the core's direct
///   delivery); the binding keeps the ``Released`` for the next ``drain_released()``.
///
/// ``max_fenced``: ranks that can be fenced at once. ``max_tokens``: transfers in flight
/// at once (default ``4 * rooms``, at most ``MAX_ROOMS``).
///
/// Arguments: every id (rank, page id, ``token``, handle) and count is an int (or has
/// ``__index__``) but never a bool, and every sequence of ids is an iterable but never a
/// str, bytes or bytearray: those raise ``TypeError`` and change nothing.
///
/// All methods are safe to call from any thread; blocking ones release the GIL.
#[pyclass(frozen, module = "kvfence._kvfence", name = "RoomTable")]
struct PyRoomTable {
    inner: Arc<Inner>,
}

impl PyRoomTable {
    fn table(&self) -> &RoomTable {
        &self.inner.table
    }

    /// A handle: any int but a bool (`TypeError`); one outside `range(2**128)` is
    /// `InvalidHandle` (a `ValueError`).
    #[inline]
    /// The ``(handle, reason)`` pairs of `taken`, in a new list; `taken` is left to the
    /// caller (a release holds no Python object), so an allocation that fails loses
    /// nothing: every pair and the list are made before anything is handed over. Every
    /// allocation here is checked (raw `PyTuple_New` / `PyList_New`: PyO3's constructors
    /// panic on a null), so a failure is a `MemoryError`, never a panic.
    fn pairs<'py>(&self, py: Python<'py>, taken: &[Released]) -> PyResult<Bound<'py, PyList>> {
        let len = ffi::Py_ssize_t::try_from(taken.len())
            .map_err(|_| PyOverflowError::new_err("too many releases for one list"))?;
        let mut pairs = Vec::with_capacity(taken.len());
        for r in taken {
            let handle = self.inner.handles.int_of(py, r.handle)?;
            let reason = word(py, Word::of_reason(r.reason))?;
            // SAFETY: we are attached; `PyTuple_New` returns a new reference or null with
            // an exception set (`from_owned_ptr_or_err` makes that `Err`).
            let pair = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyTuple_New(2))? };
            // SAFETY: `pair` is a new 2-tuple, both slots empty; `PyTuple_SetItem` steals
            // each reference (it cannot fail for a tuple and an index in range).
            unsafe {
                ffi::PyTuple_SetItem(pair.as_ptr(), 0, handle.into_ptr());
                ffi::PyTuple_SetItem(pair.as_ptr(), 1, reason.into_ptr());
            }
            pairs.push(pair);
        }
        // SAFETY: as for the tuples (not `PyList::new`, which panics on a null).
        let list = unsafe { Bound::from_owned_ptr_or_err(py, ffi::PyList_New(len))? };
        for (i, pair) in pairs.into_iter().enumerate() {
            // SAFETY: `list` is a new list of `len` slots, all empty, and `i < len`:
            // `PyList_SetItem` stores the tuple and steals our reference (it cannot fail
            // for a list and an index in range).
            unsafe { ffi::PyList_SetItem(list.as_ptr(), i as ffi::Py_ssize_t, pair.into_ptr()) };
        }
        // SAFETY: `PyList_New` made a list.
        Ok(unsafe { list.cast_into_unchecked() })
    }

    fn handle(&self, h: &Bound<'_, PyAny>) -> PyResult<RoomHandle> {
        self.inner.handles.read(h).map_err(|e| {
            if e.is_instance_of::<PyOverflowError>(h.py()) {
                raise(
                    h.py(),
                    "InvalidHandle",
                    "a room handle is an int in range(2**128) (as returned by open)".into(),
                    Attr::None,
                )
            } else {
                e
            }
        })
    }
}

/// A room's status as a dict.
fn status_dict<'py>(py: Python<'py>, s: &RoomStatus) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("handle", s.handle.to_wire())?;
    d.set_item("phase", phase_str(s.phase))?;
    d.set_item("waiting_on", PyList::new(py, s.waiting_on.iter())?)?;
    d.set_item("transfers", s.transfers)?;
    d.set_item("failed", s.failed)?;
    d.set_item("pages", s.pages)?;
    d.set_item("closing_for", s.closing_for.as_secs_f64())?;
    d.set_item("quarantined", s.quarantined)?;
    Ok(d)
}

#[pymethods]
impl PyRoomTable {
    /// Makes a table with every room (and page) free and no rank fenced.
    #[new]
    #[pyo3(
        signature = (rooms, pages=None, *, release_queue=true, max_fenced=None, max_tokens=None),
        text_signature = "(rooms, pages=None, *, release_queue=True, max_fenced=256, max_tokens=None)"
    )]
    fn new(
        py: Python<'_>,
        rooms: &Bound<'_, PyAny>,
        pages: Option<&Bound<'_, PyAny>>,
        release_queue: bool,
        max_fenced: Option<&Bound<'_, PyAny>>,
        max_tokens: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let rooms = count(rooms, "rooms")?;
        let mut config = match pages {
            None => Config::gate(rooms),
            Some(p) => Config::pool(rooms, count(p, "pages")?),
        };
        config = config
            .release_queue(release_queue)
            .max_fenced(match max_fenced {
                Some(n) => count(n, "max_fenced")?,
                None => 256,
            })
            .max_tokens(match max_tokens {
                Some(t) => count(t, "max_tokens")?,
                // The core's default (4 per room), capped at its limit so that large
                // tables get a valid default.
                None => rooms.saturating_mul(4).clamp(1, kvfence::MAX_ROOMS),
            });
        let table = py.detach(|| RoomTable::new(config)).py(py)?;
        Ok(PyRoomTable {
            inner: Arc::new(Inner {
                table,
                direct: Mutex::new(Vec::new()),
                handles: HandleCache::new(rooms),
            }),
        })
    }

    /// Rooms in the table.
    #[getter]
    fn rooms(&self) -> usize {
        self.table().config().rooms
    }

    /// The pool size (pool mode), or ``None`` (gate mode).
    #[getter]
    fn pages(&self) -> Option<usize> {
        self.table().config().pages
    }

    /// Whether this is a gate-mode table (the engine owns the pages).
    #[getter]
    fn is_gate(&self) -> bool {
        self.table().is_gate()
    }

    /// Whether releases hand rooms (and pool pages) back at ``drain_released()`` (``True``)
    /// or at once (``False``).
    #[getter]
    fn release_queue(&self) -> bool {
        self.table().config().release_queue
    }

    /// How many ranks can be fenced at once.
    #[getter]
    fn max_fenced(&self) -> usize {
        self.table().config().max_fenced
    }

    /// How many transfers can be in flight at once.
    #[getter]
    fn max_tokens(&self) -> usize {
        self.table().config().max_tokens
    }

    /// Opens a room for a request written by ``writers`` (prefill rank ids; at most
    /// ``MAX_WRITERS``, no repeats; may be empty) and returns its handle, an int (the
    /// 16-byte wire form: send it to the prefill ranks with the page ids).
    ///
    /// Gate mode: ``pages`` is the engine's page ids (any iterable of ints, or ``None``)
    /// and ``token`` the engine's request slot or id, handed back by the release. Pool
    /// mode: ``pages`` is a count (``None``: 0); read the ids with ``pages_of``;
    /// ``token`` must be 0.
    ///
    /// The room waits on every writer: each must ``quiesce`` it (or be fenced) before it
    /// can be released, even after an abort.
    ///
    /// Raises ``TableFull``, ``PoolExhausted``, ``RankFenced``, ``TooManyPages``,
    /// ``InvalidRank``, ``TooManyWriters``, ``DuplicateWriter``; on error nothing is held
    /// (``MemoryError`` once the room was made: it is undone, its release, reason
    /// ``"finished"``, delivered by ``drain_released()``).
    #[pyo3(
        signature = (writers, pages=None, token=None),
        text_signature = "(self, writers, pages=None, token=0)"
    )]
    fn open<'py>(
        &self,
        py: Python<'py>,
        writers: &Bound<'_, PyAny>,
        pages: Option<&Bound<'_, PyAny>>,
        token: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Bound<'py, PyInt>> {
        let writers = ranks(writers)?;
        let token: u64 = match token {
            None => 0,
            Some(t) => {
                no_bool(t, "token")?;
                t.extract().map_err(|e: PyErr| {
                    if e.is_instance_of::<PyOverflowError>(py) {
                        PyValueError::new_err("token must be an int in range(2**64)")
                    } else {
                        e
                    }
                })?
            }
        };
        let table = self.table();
        let handle = if table.is_gate() {
            let pages = match pages {
                None => Vec::new(),
                Some(p) => page_ids(p)?,
            };
            table.open_gate(&writers, token, pages).py(py)?
        } else {
            if token != 0 {
                return Err(PyValueError::new_err(
                    "token is for gate mode; a pool-mode release reports token 0",
                ));
            }
            let n = match pages {
                None => 0,
                Some(p) if p.is_instance_of::<PyInt>() => count(p, "pages")?,
                Some(_) => {
                    return Err(PyTypeError::new_err(
                        "pool mode: pages is a page count (int); kvfence picks the ids",
                    ))
                }
            };
            table.open(&writers, n).py(py)?.handle
        };
        match self.inner.handles.remember(py, handle) {
            Ok(int) => Ok(int),
            Err(e) => {
                // The handle's int could not be made (MemoryError): no one will ever hold
                // this room's handle, so the open is undone here. Nothing was sent for it
                // yet (the caller has no handle), so ending it as a success is no false
                // ACK: finish, every writer quiesced; the release (reason "finished") is
                // kept for `drain_released()`, so nothing is lost, pool pages included.
                if !mutant!(kvfence_py_open_leaks_room) {
                    let released = self.table().finish_drained(handle);
                    self.inner.keep(released.ok().flatten());
                }
                Err(e)
            }
        }
    }

    /// The page ids of an owned room (in the order they were added).
    ///
    /// Raises ``RoomClosed`` once the room is closing, ``StaleHandle``, ``InvalidHandle``.
    fn pages_of(&self, py: Python<'_>, h: &Bound<'_, PyAny>) -> PyResult<Vec<u32>> {
        self.table().pages_of(self.handle(h)?).py(py)
    }

    /// Adds pages to an owned room. Pool mode: ``pages`` is a count; returns the new page
    /// ids. Gate mode: ``pages`` is the engine's page ids; returns ``None``.
    ///
    /// Raises ``RoomClosed`` once the room is closing, ``TooManyPages`` (pool mode: more
    /// than the whole pool, refused before anything is claimed, as by ``open``),
    /// ``PoolExhausted``, ``StaleHandle``, ``InvalidHandle``.
    fn grow(
        &self,
        py: Python<'_>,
        h: &Bound<'_, PyAny>,
        pages: &Bound<'_, PyAny>,
    ) -> PyResult<Option<Vec<u32>>> {
        let h = self.handle(h)?;
        let table = self.table();
        if table.is_gate() {
            let ids = page_ids(pages)?;
            table.grow_gate(h, &ids).py(py)?;
            Ok(None)
        } else {
            if !pages.is_instance_of::<PyInt>() {
                return Err(PyTypeError::new_err(
                    "pool mode: pages is a page count (int); kvfence picks the ids",
                ));
            }
            // A count larger than the pool: the core refuses it before claiming anything.
            let n = count(pages, "pages")?;
            Ok(Some(table.grow(h, n).py(py)?))
        }
    }

    /// Begins a transfer on the room's pages and returns it (see ``Transfer``): the room
    /// cannot be released until it ends. ``peer``: the rank whose transport carries it, so
    /// that fencing that rank ends it if it fails.
    ///
    /// This is the check a queued transfer intent makes right before it touches the pages:
    /// after an abort it raises ``RoomClosed``, once the room is released ``StaleHandle``.
    /// Also ``TooManyTransfers``, ``InvalidHandle``.
    #[pyo3(signature = (h, peer=None))]
    fn begin_transfer(
        &self,
        py: Python<'_>,
        h: &Bound<'_, PyAny>,
        peer: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyTransfer> {
        let h = self.handle(h)?;
        let peer = peer.map(rank).transpose()?;
        let token = self.table().begin(h, peer).py(py)?;
        Ok(PyTransfer {
            inner: Arc::clone(&self.inner),
            token: token.to_wire(),
            handle: h.to_wire(),
            peer,
            ended: AtomicBool::new(false),
        })
    }

    /// Aborts the request: no transfer can begin any more, and the room is released once
    /// every writer has ACKed (``quiesce``) or been fenced and every transfer has ended.
    /// Never blocks. A finishing (draining) room is aborted too.
    ///
    /// Returns the ranks still to be told (send each an ABORT; each answers with its ACK),
    /// or ``[]`` if the room was already aborting. Raises ``StaleHandle`` once released.
    /// A ``MemoryError`` (the list could not be made) leaves the room aborted all the same:
    /// ``room_status(h)["waiting_on"]`` names the ranks still to be told.
    fn abort<'py>(&self, py: Python<'py>, h: &Bound<'_, PyAny>) -> PyResult<Bound<'py, PyList>> {
        match self.table().abort(self.handle(h)?) {
            Ok(aborted) => {
                self.inner.keep(aborted.released);
                PyList::new(py, aborted.fanout.iter())
            }
            Err(Error::AlreadyAborted) => Ok(PyList::empty(py)),
            Err(e) => Err(to_py(py, e)),
        }
    }

    /// Finishes the request normally: no transfer can begin any more, and the room is
    /// released once what is in flight drains (transfers, writers not yet quiesced).
    ///
    /// Raises ``AlreadyFinished``, ``AlreadyAborted`` (both ``RoomClosed``),
    /// ``StaleHandle``.
    fn finish(&self, py: Python<'_>, h: &Bound<'_, PyAny>) -> PyResult<()> {
        let released = self.table().finish(self.handle(h)?).py(py)?;
        self.inner.keep(released);
        Ok(())
    }

    /// The normal end of a request whose every writer rank reported its last write
    /// complete (a successful transfer): ``finish``, then ``quiesce`` of every writer still
    /// pending, in one call. Returns ``True`` if this call released the room (reason
    /// ``"finished"``): that release is **not queued**, even with ``release_queue=True``,
    /// and nothing is left to act on (a finished room's pages stay with the request; in
    /// pool mode they are back in the pool). ``False`` if a transfer still holds the room:
    /// its end releases it, and ``drain_released()`` delivers that (as it delivers a
    /// release this call made with another reason, a racing ``quarantine``'s). Only for
    /// rooms whose writers all reported success: on any other room it is a false ACK of
    /// each of them.
    ///
    /// Raises as ``finish`` (nothing is quiesced then).
    fn finish_drained(&self, py: Python<'_>, h: &Bound<'_, PyAny>) -> PyResult<bool> {
        match self.table().finish_drained(self.handle(h)?).py(py)? {
            Some(r) if r.reason == Reason::Finished => Ok(true),
            other => {
                self.inner.keep(other);
                Ok(false)
            }
        }
    }

    /// Records writer ``rank``'s ACK: it will write no more to this room (it drained its
    /// queue and in-flight writes). Returns:
    ///
    /// * ``"recorded"``: noted; the room still waits on others, or is still live;
    /// * ``"duplicate"``: this rank had already ACKed this lifecycle (counts once);
    /// * ``"released"``: this was the last thing the closing room waited on: it is released
    ///   (the release is delivered by ``drain_released()``);
    /// * ``"stale"``: the handle's lifecycle is over (a late ACK): nothing was touched.
    ///
    /// Raises ``RankNotInRoom``, ``InvalidHandle``.
    fn quiesce<'py>(
        &self,
        py: Python<'py>,
        h: &Bound<'_, PyAny>,
        rank: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyString>> {
        let h = self.handle(h)?;
        let rank = self::rank(rank)?;
        // Interned at import: an ACK returns one of four shared strings, no allocation
        // (a release this call returned is kept before the word is fetched).
        let w = match self.table().quiesce(h, rank) {
            Ok(Quiesced::Recorded) => Word::Recorded,
            Ok(Quiesced::Duplicate) => Word::Duplicate,
            Ok(Quiesced::Queued) => Word::Released,
            Ok(Quiesced::Released(released)) => {
                self.inner.keep(Some(released));
                Word::Released
            }
            Err(Error::StaleHandle) => Word::Stale,
            Err(e) => return Err(to_py(py, e)),
        };
        word(py, w)
    }

    /// Declares that ``rank`` can no longer write anywhere (its transport is torn down):
    /// quiesces it in every live room, ends every failed transfer to it, and refuses new
    /// rooms naming it until ``readmit_rank``. Only call it once no write from the rank can
    /// land any more. Scans the table with the GIL released.
    ///
    /// Returns how many rooms it released. The releases themselves come from
    /// ``drain_released()`` in both modes.
    ///
    /// Raises ``InvalidRank``, ``TooManyFenced``.
    fn fence_rank(&self, py: Python<'_>, rank: &Bound<'_, PyAny>) -> PyResult<usize> {
        let rank = self::rank(rank)?;
        let table = self.table();
        let fenced = py.detach(|| table.fence_rank(rank)).py(py)?;
        let n = fenced.released.len() + fenced.queued;
        for released in fenced.released {
            self.inner.keep(Some(released));
        }
        Ok(n)
    }

    /// Re-admits a fenced rank (it has a new transport), or forgets a fenced rank id.
    /// Returns whether it was fenced. Waits (GIL released) for a running ``fence_rank``
    /// scan to finish first. Raises ``InvalidRank``.
    fn readmit_rank(&self, py: Python<'_>, rank: &Bound<'_, PyAny>) -> PyResult<bool> {
        let rank = self::rank(rank)?;
        let table = self.table();
        py.detach(|| table.readmit_rank(rank)).py(py)
    }

    /// Ends a room that can never be proven drained (a failed transfer whose peer's
    /// transport cannot be torn down): gives up on its pending writers and failed
    /// transfers. The room index returns once local transfers end; its pages never do:
    /// the release says ``reason == "quarantined"``. Raises ``StaleHandle``.
    fn quarantine(&self, py: Python<'_>, h: &Bound<'_, PyAny>) -> PyResult<()> {
        let released = self.table().quarantine(self.handle(h)?).py(py)?;
        self.inner.keep(released);
        Ok(())
    }

    /// Every release not yet delivered, each exactly once (from any thread: concurrent
    /// callers get disjoint lists). Call it each scheduler loop, then free the pages of
    /// every release whose ``reason`` is not ``"quarantined"`` (gate mode).
    ///
    /// If it raises (``MemoryError``: a list or a ``Released`` could not be allocated), it
    /// delivered nothing and lost nothing: the next call returns every release it took.
    fn drain_released<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let mut taken = self.inner.take_all();
        match Inner::to_list(py, &mut taken) {
            Ok(list) => Ok(list),
            Err(e) => {
                if !mutant!(kvfence_py_drain_loses) {
                    self.inner.put_back(taken);
                }
                // MUTATION (test-only, `kvfence_py_drain_loses`): the releases are dropped,
                // as the old append loop dropped them.
                Err(e)
            }
        }
    }

    /// Every undelivered release as a ``(handle, reason)`` pair, each exactly once (from
    /// any thread: concurrent callers get disjoint lists): ``drain_released()`` without a
    /// ``Released`` object per release, for a gate-mode engine that keeps its own page
    /// lists (its rooms opened with ``pages=None``). The handle is the int ``open``
    /// returned while the binding still caches it (a dict keyed by handles then compares
    /// by identity), else an equal int; ``reason`` is one of three shared strings.
    ///
    /// Delivers nothing and loses nothing if it raises: ``ValueError`` if one of the
    /// releases carries page ids in gate mode (the engine must free those:
    /// ``drain_released()`` returns them), ``MemoryError`` if a pair or the list could not
    /// be allocated. Pool mode: the pages are already back in the pool, so any release
    /// comes out as a pair.
    fn drain_reasons<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let taken = self.inner.take_all();
        if self.table().is_gate() && taken.iter().any(|r| !r.pages.is_empty()) {
            self.inner.put_back(taken);
            return Err(PyValueError::new_err(
                "drain_reasons: a release carries page ids (its room was opened with pages): \
                 drain_released() returns them",
            ));
        }
        match self.pairs(py, &taken) {
            Ok(list) => Ok(list),
            Err(e) => {
                // MUTATION (test-only, `kvfence_py_drain_loses`): the releases are dropped.
                if !mutant!(kvfence_py_drain_loses) {
                    self.inner.put_back(taken);
                }
                Err(e)
            }
        }
    }

    /// One undelivered release, or ``None``. If it raises (``MemoryError``), the release
    /// stays for the next call.
    fn pop_released<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyReleased>>> {
        let taken = lock(&self.inner.direct).pop();
        let Some(released) = taken.or_else(|| self.table().pop_released()) else {
            return Ok(None);
        };
        match PyReleased::new_bound(py, released) {
            Ok(obj) => Ok(Some(obj)),
            Err((e, released)) => {
                if !mutant!(kvfence_py_drain_loses) {
                    self.inner.put_back(vec![released]);
                }
                Err(e)
            }
        }
    }

    /// How many releases wait for ``drain_released()``.
    fn queued_releases(&self) -> usize {
        lock(&self.inner.direct).len() + self.table().queued_releases()
    }

    /// The phase of the handle's lifecycle: ``"owned"``, ``"aborting"``, ``"draining"``,
    /// or ``"free"`` once released. Raises ``InvalidHandle``.
    fn phase<'py>(&self, py: Python<'py>, h: &Bound<'_, PyAny>) -> PyResult<Bound<'py, PyString>> {
        let phase = self.table().phase(self.handle(h)?).py(py)?;
        word(py, Word::of_phase(phase))
    }

    /// The status of a live room: a dict with ``handle``, ``phase``, ``waiting_on`` (ranks
    /// that have not ACKed), ``transfers`` (holding it, failed ones included), ``failed``,
    /// ``pages`` (count), ``closing_for`` (seconds since abort/finish) and
    /// ``quarantined``. Raises ``StaleHandle`` once released.
    fn room_status<'py>(
        &self,
        py: Python<'py>,
        h: &Bound<'_, PyAny>,
    ) -> PyResult<Bound<'py, PyDict>> {
        let status = self.table().room_status(self.handle(h)?).py(py)?;
        status_dict(py, &status)
    }

    /// Blocks (GIL released) until the handle's lifecycle is released, or ``timeout``
    /// seconds pass. Returns whether it was released. With ``release_queue=False`` its room
    /// index and pool pages are then back; with ``release_queue=True`` the release is in
    /// the queue, and the next ``drain_released()`` (the waiter's own, typically) delivers
    /// it and hands them back. Waiting never changes the table (time never releases a room).
    #[pyo3(signature = (h, timeout=None))]
    fn wait_released(
        &self,
        py: Python<'_>,
        h: &Bound<'_, PyAny>,
        timeout: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<bool> {
        let h = self.handle(h)?;
        let timeout = timeout_arg(timeout)?;
        let table = self.table();
        wait_loop(py, timeout, |slice| table.wait_released_timeout(h, slice))
    }

    /// Blocks (GIL released) until no room is owned or closing, every release delivered or
    /// queued (shutdown drain: then ``drain_released()``), or ``timeout`` seconds pass.
    /// Returns whether the table is idle.
    #[pyo3(signature = (timeout=None))]
    fn wait_idle(&self, py: Python<'_>, timeout: Option<&Bound<'_, PyAny>>) -> PyResult<bool> {
        let timeout = timeout_arg(timeout)?;
        let table = self.table();
        wait_loop(py, timeout, |slice| Ok(table.wait_idle_timeout(slice)))
    }

    /// A snapshot (taken with the GIL released) as a dict: ``rooms_free``,
    /// ``rooms_owned``, ``rooms_closing``, ``rooms_queued`` (released, not yet drained),
    /// ``pages_free`` (pool mode), ``pages_owned``, ``pages_held`` (in closing rooms),
    /// ``pages_queued``, ``releases`` (delivered), ``stale_refused``, ``duplicate_acks``,
    /// ``failed_transfers``, ``quarantined_rooms``, ``quarantined_pages``, ``fenced``
    /// (sorted rank ids), ``queued_releases`` and ``closing`` (a ``room_status`` dict per
    /// closing room).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let table = self.table();
        let s = py.detach(|| table.stats());
        let d = PyDict::new(py);
        d.set_item("rooms_free", s.rooms.free)?;
        d.set_item("rooms_owned", s.rooms.owned)?;
        d.set_item("rooms_closing", s.rooms.held)?;
        d.set_item("rooms_queued", s.rooms.queued)?;
        d.set_item("pages_free", s.pages.free)?;
        d.set_item("pages_owned", s.pages.owned)?;
        d.set_item("pages_held", s.pages.held)?;
        d.set_item("pages_queued", s.pages.queued)?;
        d.set_item("releases", s.releases)?;
        d.set_item("stale_refused", s.stale_refused)?;
        d.set_item("duplicate_acks", s.duplicate_acks)?;
        d.set_item("failed_transfers", s.failed_transfers)?;
        d.set_item("quarantined_rooms", s.quarantined_rooms)?;
        d.set_item("quarantined_pages", s.quarantined_pages)?;
        d.set_item("fenced", PyList::new(py, &s.fenced)?)?;
        d.set_item("queued_releases", self.queued_releases())?;
        let closing = PyList::empty(py);
        for room in &s.closing {
            closing.append(status_dict(py, room)?)?;
        }
        d.set_item("closing", closing)?;
        Ok(d)
    }

    /// The constructor call that makes an (empty) table of this configuration.
    fn __repr__(&self) -> String {
        let c = self.table().config();
        let pages = match c.pages {
            Some(p) => p.to_string(),
            None => "None".to_owned(),
        };
        format!(
            "RoomTable(rooms={}, pages={pages}, release_queue={}, max_fenced={}, max_tokens={})",
            c.rooms,
            py_bool(c.release_queue),
            c.max_fenced,
            c.max_tokens
        )
    }
}

/// kvfence's native module (import ``kvfence``, not this).
///
/// `gil_used = false`: a free-threaded interpreter may keep its GIL off. The table is
/// lock-free and `Sync`, the binding's own state is behind mutexes, and the fast paths that
/// read borrowed references are compiled only for interpreters with a GIL.
#[pymodule(gil_used = false)]
fn _kvfence(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyRoomTable>()?;
    m.add_class::<PyTransfer>()?;
    m.add_class::<PyReleased>()?;
    m.add_class::<PyTransferQueue>()?;
    m.add("MAX_WRITERS", kvfence::MAX_WRITERS)?;
    m.add("MAX_ROOMS", kvfence::MAX_ROOMS)?;
    m.add("MAX_PAGES", kvfence::MAX_PAGES)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    let py = m.py();
    WORDS.get_or_try_init(py, || -> PyResult<[Py<PyString>; Word::ALL.len()]> {
        let mut made = Vec::with_capacity(Word::ALL.len());
        for w in Word::ALL {
            made.push(interned(py, w.text())?.unbind());
        }
        Ok(made
            .try_into()
            .unwrap_or_else(|_| unreachable!("one word per Word::ALL entry")))
    })?;
    Ok(())
}
