//! uswap's Python extension module, `uswap._uswap`: a `Swap` (one uswap
//! instance: a budget, its devices, its threads) and the `Region`s mapped
//! through it, each exporting its memory through the buffer protocol, so
//! `memoryview(region)` and `numpy.frombuffer(region)` read and write the
//! pages uswap swaps, with no copy.  The package around it
//! (`python/uswap/__init__.py`) adds `uswap.array` and the default
//! instance.
//!
//! What the objects own:
//!
//! - `Swap`: the handle.  `close()` (or leaving its `with`) lets it go;
//!   the instance itself lives until its last region goes too, so closing
//!   it under live arrays is safe, as `uswap_close` is in C.
//! - `Region`: one mapping.  Every buffer exported from it (a memoryview,
//!   a numpy array, and whatever views those make) holds a reference to
//!   it, so it cannot be freed under them; `close()` with an export still
//!   alive raises `BufferError` rather than unmap memory something still
//!   points at.
//!
//! Threads: the interpreter lock is let go while a region is unmapped and
//! while an instance is built (it may connect to a server).  Faults need
//! no lock at all: in SIGBUS mode the faulting thread serves its own, in
//! handler mode uswap's threads do.

#![deny(unsafe_op_in_unsafe_fn)]

use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use pyo3::create_exception;
use pyo3::exceptions::{PyBufferError, PyException, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use uswap::pager::{FaultMode, PagerError, PinnedShared, Region, Swap, SwapDeviceSpec};

create_exception!(
    uswap,
    Error,
    PyException,
    "What uswap refused, or could not do; the message is one line naming the cause and what to do."
);
create_exception!(uswap, SpecError, Error, "A swap spec that does not parse.");
create_exception!(
    uswap,
    DeviceError,
    Error,
    "A swap device that could not be set up (a file, a server)."
);
create_exception!(
    uswap,
    KernelError,
    Error,
    "The kernel lacks what uswap needs (userfaultfd, UFFDIO_MOVE: Linux 6.8 or newer), or refused it."
);
create_exception!(
    uswap,
    LimitError,
    Error,
    "Too many regions, or pages, for this instance; or memory for them could not be mapped."
);
create_exception!(
    uswap,
    ForkedError,
    Error,
    "Called in a child that did not adopt the instance (made by a raw clone, not fork)."
);

/// A pager error as the exception a Python caller can catch by kind.
fn raise(e: PagerError) -> PyErr {
    let message = e.to_string();
    match e {
        PagerError::Uffd(_) => KernelError::new_err(message),
        PagerError::Io(_) => DeviceError::new_err(message),
        // The library's remedy is a builder setting Python does not have.
        PagerError::TooManyPages { pages, max, free } => LimitError::new_err(format!(
            "cannot map {pages} more pages: a Swap's regions span at most its budget plus its swap, {max} pages here ({free} free); give it more swap (swap=\"zram:16G\", \"file:/var/tmp:64G\") or map less"
        )),
        PagerError::Mmap { .. } | PagerError::Metadata(_) | PagerError::TooManyRegions => LimitError::new_err(message),
        PagerError::Config(_) => PyValueError::new_err(message),
        PagerError::Forked { .. } => ForkedError::new_err(message),
        PagerError::Range { .. } => PyValueError::new_err(message),
        // The library's remedy names its Rust spelling; a Python caller's
        // is the constructor's argument.
        PagerError::SigbusBlocked => Error::new_err(
            "this thread blocks SIGBUS: in SIGBUS mode its first touch of swapped memory would kill the process; unblock SIGBUS here (signal.pthread_sigmask), or build the Swap with mode=\"handler\"",
        ),
        _ => Error::new_err(message),
    }
}

/// A size: an int of bytes, or a string with a binary suffix ("512M",
/// "4G", "1.5GiB").
fn size(what: &str, v: &Bound<'_, PyAny>) -> PyResult<u64> {
    if let Ok(s) = v.cast::<PyString>() {
        let s = s.to_str()?;
        return uswap::spec::parse_size(s).ok_or_else(|| {
            PyValueError::new_err(format!(
                "{what}={s:?} is not a size: give bytes as an int, or a number with K, M, G or T (\"512M\", \"4G\")"
            ))
        });
    }
    let n: i64 = v.extract().map_err(|_| {
        PyTypeError::new_err(format!(
            "{what} is a size: an int of bytes, or a string such as \"4G\""
        ))
    })?;
    u64::try_from(n)
        .map_err(|_| PyValueError::new_err(format!("{what}={n} is negative: give a size in bytes")))
}

/// Swap devices: one spec string (a tier is one device: "zram:1G,file:/var/tmp:8G"),
/// or a sequence of them, used in the order given.
fn devices(v: &Bound<'_, PyAny>) -> PyResult<Vec<SwapDeviceSpec>> {
    let specs: Vec<String> = match v.extract::<String>() {
        Ok(s) => vec![s],
        Err(_) => v.extract().map_err(|_| {
            PyTypeError::new_err("swap is a spec string (\"zram:4G\", \"file:/var/tmp:8G\", \"nbd://host/export\") or a list of them")
        })?,
    };
    specs
        .iter()
        .map(|s| {
            s.parse::<SwapDeviceSpec>()
                .map_err(|e| SpecError::new_err(e.to_string()))
        })
        .collect()
}

fn fault_mode(mode: &str) -> PyResult<FaultMode> {
    match mode {
        "sigbus" => Ok(FaultMode::Sigbus),
        "handler" => Ok(FaultMode::HandlerThread),
        other => Err(PyValueError::new_err(format!(
            "mode={other:?}: give \"sigbus\" (the faulting thread serves its fault; any user) or \"handler\" (uswap's threads serve them, the kernel's own accesses too; root or vm.unprivileged_userfaultfd=1)"
        ))),
    }
}

/// One uswap instance: a memory budget, its swap devices, and the
/// regions mapped through it.
///
/// ``Swap(budget, swap=None, mode="sigbus")``: at most ``budget`` bytes of
/// its regions are resident (an int, or a string such as ``"1G"``); the
/// rest is paged out to ``swap``, a swap spec (``"zram:4G"``,
/// ``"file:/var/tmp:8G"``, ``"zram:1G,file:/var/tmp:8G"``,
/// ``"nbd://host/export"``) or a list of them; without one, a compressed
/// store of four times the budget.  ``mode`` is who serves faults:
/// ``"sigbus"`` (the faulting thread, any user) or ``"handler"`` (uswap's
/// threads; serves the kernel's own accesses too, such as
/// ``file.readinto(region)``; needs root or
/// ``vm.unprivileged_userfaultfd=1``).
#[pyclass(module = "uswap", name = "Swap", frozen)]
struct PySwap {
    /// None once closed.  A lock, not a borrow flag: any thread may call
    /// any method at any time.  Taken only with the interpreter lock held
    /// and never held across a `detach` (a thread waiting for it would
    /// hold the interpreter lock the detached one needs back): a call that
    /// lets the interpreter go clones the `Arc` and lets this go first.
    swap: Mutex<Option<Arc<Swap>>>,
    mode: FaultMode,
}

impl PySwap {
    fn get(&self) -> PyResult<Arc<Swap>> {
        let guard = self.swap.lock().unwrap_or_else(|p| p.into_inner());
        match guard.as_ref() {
            Some(s) => Ok(Arc::clone(s)),
            None => Err(PyValueError::new_err("this Swap is closed: build a new one")),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&Swap) -> PyResult<T>) -> PyResult<T> {
        let s = self.get()?;
        f(&s)
    }
}

#[pymethods]
impl PySwap {
    #[new]
    #[pyo3(signature = (budget, swap = None, mode = "sigbus"))]
    fn new(
        py: Python<'_>,
        budget: &Bound<'_, PyAny>,
        swap: Option<&Bound<'_, PyAny>>,
        mode: &str,
    ) -> PyResult<Self> {
        let budget = size("budget", budget)?;
        if budget < uswap::PAGE_SIZE as u64 {
            return Err(PyValueError::new_err(format!(
                "budget={budget} is less than a page: give at least 4096 bytes (\"64M\", \"1G\")"
            )));
        }
        let mode = fault_mode(mode)?;
        let specs = match swap {
            Some(s) if !s.is_none() => devices(s)?,
            _ => vec![SwapDeviceSpec::compressed(uswap::spec::CompressedOptions::new(
                budget.saturating_mul(4),
            ))],
        };
        let built = py.detach(move || {
            let mut b = Swap::builder().budget(budget).fault_mode(mode);
            for d in specs {
                b = b.device(d);
            }
            b.build()
        });
        Ok(PySwap {
            swap: Mutex::new(Some(Arc::new(built.map_err(raise)?))),
            mode,
        })
    }

    /// Map a region of ``nbytes`` (rounded up to whole pages; with
    /// ``huge``, to 2 MB units swapped whole), zero filled, paged under the
    /// budget.  Use it as a buffer: ``memoryview(region)``,
    /// ``numpy.frombuffer(region, dtype)``.
    #[pyo3(signature = (nbytes, huge = false))]
    fn map(&self, py: Python<'_>, nbytes: i64, huge: bool) -> PyResult<PyRegion> {
        let Ok(len) = usize::try_from(nbytes) else {
            return Err(PyValueError::new_err(format!(
                "map({nbytes}): a negative size; give the region's length in bytes"
            )));
        };
        if len == 0 {
            return Err(PyValueError::new_err(
                "map(0): a region of 0 bytes; give its length in bytes",
            ));
        }
        let s = self.get()?;
        // A large region's tables take a while to map: let other threads run.
        let region = py
            .detach(move || if huge { s.map_huge(len) } else { s.map(len) })
            .map_err(raise)?;
        Ok(PyRegion {
            region: Mutex::new(Some(Arc::new(region))),
            exports: AtomicUsize::new(0),
        })
    }

    /// The instance's statistics now, as a dict of ints (bytes and
    /// counts): ``budget_bytes``, ``resident_bytes``,
    /// ``peak_resident_bytes``, ``swap_total_bytes``, ``swap_used_bytes``,
    /// ``faults``, ``swapins``, ``readahead``, ``evictions``,
    /// ``io_write_bytes``, ``io_read_bytes``, and for a compressed store
    /// ``store_orig_bytes`` (what it holds), ``store_compr_bytes`` (what
    /// that compressed to) and ``store_mem_bytes`` (the memory it uses).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let page = uswap::PAGE_SIZE as u64;
        let d = PyDict::new(py);
        self.with(|s| {
            let st = s.stats();
            let items: [(&str, u64); 14] = [
                ("budget_bytes", s.budget_pages() as u64 * page),
                ("resident_bytes", s.resident_pages() as u64 * page),
                ("peak_resident_bytes", s.peak_resident_pages() as u64 * page),
                ("swap_total_bytes", s.total_slots() * page),
                ("swap_used_bytes", (s.total_slots() - s.free_slots()) * page),
                ("faults", st.counters.faults),
                ("swapins", st.counters.swapins),
                ("readahead", st.counters.readahead),
                ("evictions", st.counters.evictions),
                ("io_write_bytes", st.counters.io_write_pages * page),
                ("io_read_bytes", st.counters.io_read_pages * page),
                ("store_orig_bytes", st.gauges.store_orig_bytes),
                ("store_compr_bytes", st.gauges.store_compr_bytes),
                ("store_mem_bytes", st.gauges.store_mem_bytes),
            ];
            for (k, v) in items {
                d.set_item(k, v)?;
            }
            Ok(())
        })?;
        Ok(d)
    }

    /// The budget in bytes; set it to change it at run time (pages over a
    /// lower one are evicted).
    #[getter]
    fn get_budget(&self) -> PyResult<u64> {
        self.with(|s| Ok(s.budget_pages() as u64 * uswap::PAGE_SIZE as u64))
    }

    #[setter]
    fn set_budget(&self, budget: &Bound<'_, PyAny>) -> PyResult<()> {
        let bytes = size("budget", budget)?;
        self.with(|s| s.set_budget(bytes).map_err(raise))
    }

    /// Who serves faults: "sigbus" or "handler".
    #[getter]
    fn mode(&self) -> &'static str {
        match self.mode {
            FaultMode::Sigbus => "sigbus",
            FaultMode::HandlerThread => "handler",
        }
    }

    /// Whether ``close()`` was called.
    #[getter]
    fn closed(&self) -> bool {
        self.swap.lock().unwrap_or_else(|p| p.into_inner()).is_none()
    }

    /// Let the handle go.  Regions still mapped stay usable; the instance
    /// ends with the last of them.  Closing twice does nothing.
    fn close(&self, py: Python<'_>) {
        let swap = self.swap.lock().unwrap_or_else(|p| p.into_inner()).take();
        // The last owner joins the instance's threads.
        py.detach(move || drop(swap));
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }

    fn __repr__(&self) -> String {
        match self.with(|s| Ok(s.budget_pages() as u64 * uswap::PAGE_SIZE as u64)) {
            Ok(b) => format!("<uswap.Swap budget={b} mode={}>", self.mode()),
            Err(_) => "<uswap.Swap closed>".into(),
        }
    }
}

/// A region of memory paged by a ``Swap``: zero filled, at most the
/// budget of it resident.  A writable buffer of unsigned bytes:
/// ``memoryview(region)`` and ``numpy.frombuffer(region, dtype)`` use its
/// memory with no copy.  ``close()`` (or leaving its ``with``) unmaps it;
/// with a view still alive that raises ``BufferError``.
#[pyclass(module = "uswap", name = "Region", frozen)]
struct PyRegion {
    /// None once closed.  Shared only with its pins ([`PyPin`]), which
    /// count as exports: with none, `close` holds the last reference.
    region: Mutex<Option<Arc<Region>>>,
    /// Buffers exported and pins held, not yet released.  Raised only
    /// with the interpreter lock held (the buffer protocol's calls and
    /// `pin` hold it), and read by `close` under `region`'s lock, so a
    /// close and an export never pass each other.
    exports: AtomicUsize,
}

impl PyRegion {
    /// The region, unless closed.  The clone is taken with the
    /// interpreter lock held, so no `close` comes between it and what the
    /// caller does with it under the same lock (an export's count).
    fn get(&self) -> PyResult<Arc<Region>> {
        let guard = self.region.lock().unwrap_or_else(|p| p.into_inner());
        match guard.as_ref() {
            Some(r) => Ok(Arc::clone(r)),
            None => Err(PyValueError::new_err(
                "this Region is closed (unmapped): map a new one",
            )),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&Region) -> PyResult<T>) -> PyResult<T> {
        let r = self.get()?;
        f(&r)
    }
}

impl Drop for PyRegion {
    /// The last reference went (an array from `uswap.array` garbage
    /// collected): unmap with the interpreter lock let go, as `close`
    /// does.  4 GiB, a quarter of it resident, took 0.23 s.
    fn drop(&mut self) {
        let region = self.region.get_mut().unwrap_or_else(|p| p.into_inner()).take();
        if region.is_some() {
            Python::attach(|py| py.detach(move || drop(region)));
        }
    }
}

#[pymethods]
impl PyRegion {
    /// Its length in bytes (whole pages).
    #[getter]
    fn nbytes(&self) -> PyResult<usize> {
        self.with(|r| Ok(r.len()))
    }

    fn __len__(&self) -> PyResult<usize> {
        self.nbytes()
    }

    /// Its first byte's address (for ctypes and C code; valid until it
    /// is closed).
    #[getter]
    fn address(&self) -> PyResult<usize> {
        self.with(|r| Ok(r.as_ptr() as usize))
    }

    /// Whether it is closed (unmapped).
    #[getter]
    fn closed(&self) -> bool {
        self.region.lock().unwrap_or_else(|p| p.into_inner()).is_none()
    }

    /// Discard ``nbytes`` at ``offset`` (whole pages; the rest of the
    /// region without ``nbytes``): they read as zeros again, and their
    /// memory and swap are given back, as ``MADV_DONTNEED`` does.
    #[pyo3(signature = (offset = 0, nbytes = None))]
    fn discard(&self, offset: usize, nbytes: Option<usize>) -> PyResult<()> {
        self.with(|r| {
            let n = nbytes.unwrap_or_else(|| r.len().saturating_sub(offset));
            r.discard(offset, n).map_err(raise)
        })
    }

    /// Pin ``nbytes`` at ``offset`` (the rest of the region without
    /// ``nbytes``) for a system call: every page is brought in (and made
    /// writable when ``write``, for a call that stores into it, such as
    /// ``file.readinto``) and stays until the pin is released (``with``,
    /// or ``release()``).  In SIGBUS mode the kernel cannot bring a page
    /// in for a system call, which then fails with ``EFAULT``; a pin
    /// makes the pages be there.  Pinned pages are not evicted: pin a
    /// part of the budget at a time (tens of MiB), for the call.
    #[pyo3(signature = (offset = 0, nbytes = None, write = true))]
    fn pin(slf: Bound<'_, Self>, offset: usize, nbytes: Option<usize>, write: bool) -> PyResult<PyPin> {
        let me = slf.get();
        let region = me.get()?;
        let n = nbytes.unwrap_or_else(|| region.len().saturating_sub(offset));
        // Touches the pages from this thread (served as the program's own
        // faults), with the interpreter lock held: no close can come
        // between the clone above and the count below.
        let pinned = region.pin_shared(offset, n, write).map_err(raise)?;
        me.exports.fetch_add(1, Ordering::AcqRel);
        Ok(PyPin {
            pinned: Mutex::new(Some(pinned)),
            region: slf.unbind(),
        })
    }

    /// Unmap it: its memory and swap are given back.  Raises
    /// ``BufferError`` while a memoryview or an array still uses its
    /// memory (delete them first).  Closing twice does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let region = {
            let mut guard = self.region.lock().unwrap_or_else(|p| p.into_inner());
            let views = self.exports.load(Ordering::Acquire);
            if views > 0 && guard.is_some() {
                return Err(PyBufferError::new_err(format!(
                    "this Region is in use by {views} view(s) (a memoryview, a numpy array or a view of one, a pin): delete them (del array), or release the memoryview or pin, before closing it"
                )));
            }
            guard.take()
        };
        // Unmapping a large region frees many slots: let other threads run.
        py.detach(move || drop(region));
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    fn __repr__(&self) -> String {
        match self.with(|r| Ok((r.as_ptr() as usize, r.len()))) {
            Ok((a, n)) => format!("<uswap.Region {n} bytes at {a:#x}>"),
            Err(_) => "<uswap.Region closed>".into(),
        }
    }

    /// The buffer protocol's export: the region's bytes, writable, one
    /// dimension of unsigned bytes ("B").
    ///
    /// # Safety
    /// Called by the interpreter with a `Py_buffer` to fill.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let me = slf.get();
        let r = me.get()?;
        // SAFETY: `view` is the interpreter's to fill; the memory is the
        // region's mapping, alive while this export holds a reference to
        // `slf` (the view's `obj`, set by PyBuffer_FillInfo) and so keeps
        // `close` from unmapping it (`exports`).
        let filled = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                r.as_ptr().cast(),
                r.len() as ffi::Py_ssize_t,
                0,
                flags,
            )
        };
        if filled != 0 {
            return Err(PyErr::fetch(slf.py()));
        }
        me.exports.fetch_add(1, Ordering::AcqRel);
        Ok(())
    }

    /// # Safety
    /// Called by the interpreter for a view `__getbuffer__` filled.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        self.exports.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Pages of a region pinned by ``Region.pin``: resident, and writable when
/// asked, until ``release()`` (or the end of its ``with``).  Counts as a
/// view of its region.
#[pyclass(module = "uswap", name = "Pin", frozen)]
struct PyPin {
    /// None once released.
    pinned: Mutex<Option<PinnedShared>>,
    region: Py<PyRegion>,
}

impl PyPin {
    fn let_go(&self) {
        let pinned = self.pinned.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(p) = pinned {
            drop(p);
            self.region.get().exports.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for PyPin {
    fn drop(&mut self) {
        self.let_go();
    }
}

#[pymethods]
impl PyPin {
    /// Let the pages go (they may be evicted again).  Twice does nothing.
    fn release(&self) {
        self.let_go();
    }

    /// Whether ``release()`` was called.
    #[getter]
    fn released(&self) -> bool {
        self.pinned.lock().unwrap_or_else(|p| p.into_inner()).is_none()
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.let_go();
        false
    }
}

/// The package's native half; `uswap/__init__.py` re-exports it.
#[pymodule]
fn _uswap(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<PySwap>()?;
    m.add_class::<PyRegion>()?;
    m.add_class::<PyPin>()?;
    m.add("Error", py.get_type::<Error>())?;
    m.add("SpecError", py.get_type::<SpecError>())?;
    m.add("DeviceError", py.get_type::<DeviceError>())?;
    m.add("KernelError", py.get_type::<KernelError>())?;
    m.add("LimitError", py.get_type::<LimitError>())?;
    m.add("ForkedError", py.get_type::<ForkedError>())?;
    m.add("PAGE_SIZE", uswap::PAGE_SIZE)?;
    m.add("MAX_REGIONS", uswap::pager::MAX_REGIONS)?;
    Ok(())
}
