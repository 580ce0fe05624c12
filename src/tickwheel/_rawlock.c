/* RawLock: a mutual-exclusion lock whose uncontended acquire and release cost a
 * C function call each.
 *
 * Why it exists: the timers take a lock on every schedule and every cancel, and the
 * purgatory several times per operation. On CPython 3.11 ``threading.Lock.acquire()``
 * goes through PyArg_ParseTupleAndKeywords and reads the monotonic clock, and the
 * pure-Python fallback (a ``queue.SimpleQueue`` holding one token) shrinks and regrows
 * the queue's list on every get/put. Callgrind, W3 at 1M pending (cancel one task,
 * schedule another): a lock cycle cost 548 instructions with the token, 362 with this
 * type over the PyThread lock, 235 over a glibc semaphore; the compiled schedule+cancel
 * pair costs 1,948 instructions with this type and 2,570 with the token.
 *
 * Semantics are those of ``_thread.lock``: not reentrant, any thread may release, a
 * blocking acquire releases the GIL while it waits and lets signal handlers run (so
 * Ctrl-C interrupts a thread stuck on the lock).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include "pythread.h"

/* The primitive. glibc's unnamed POSIX semaphores where they have sem_clockwait
 * (glibc 2.30+): an uncontended sem_trywait or sem_post is one atomic instruction and
 * a few dozen others. Elsewhere the interpreter's PyThread lock, whose every acquire
 * first reads the monotonic clock (~130 instructions uncontended on 3.11). */
#if defined(__linux__) && defined(__GLIBC__) && defined(__GLIBC_PREREQ)
#if __GLIBC_PREREQ(2, 30)
#define RAWLOCK_SEM 1
#endif
#endif

#ifdef RAWLOCK_SEM
#include <errno.h>
#include <semaphore.h>
#include <time.h>
#endif

typedef struct {
    PyObject_HEAD
#ifdef RAWLOCK_SEM
    sem_t sem;
    char ready;
#else
    PyThread_type_lock lock;
#endif
    char locked;  /* only read or written with the GIL held */
} RawLock;

/* 0 on success, -1 with an exception set. */
static int
prim_init(RawLock *self)
{
#ifdef RAWLOCK_SEM
    if (sem_init(&self->sem, 0, 1) != 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        return -1;
    }
    self->ready = 1;
#else
    self->lock = PyThread_allocate_lock();
    if (self->lock == NULL) {
        PyErr_SetString(PyExc_MemoryError, "cannot allocate a lock");
        return -1;
    }
#endif
    return 0;
}

static void
prim_fini(RawLock *self)
{
#ifdef RAWLOCK_SEM
    if (self->ready) {
        sem_destroy(&self->sem);
    }
#else
    if (self->lock != NULL) {
        /* Some platforms cannot free a held lock (as in _threadmodule.c). */
        if (self->locked) {
            PyThread_release_lock(self->lock);
        }
        PyThread_free_lock(self->lock);
    }
#endif
}

/* 1 if the lock was free and is now ours; never waits. */
static inline int
prim_try(RawLock *self)
{
#ifdef RAWLOCK_SEM
    return sem_trywait(&self->sem) == 0;
#else
    return PyThread_acquire_lock(self->lock, NOWAIT_LOCK);
#endif
}

static inline void
prim_post(RawLock *self)
{
#ifdef RAWLOCK_SEM
    sem_post(&self->sem);
#else
    PyThread_release_lock(self->lock);
#endif
}

/* Wait for the lock without the GIL, letting signal handlers run (as Lock.acquire
 * does). 0 once it is held, -1 with an exception set if a handler raised. */
static int
prim_wait(RawLock *self)
{
    for (;;) {
        int interrupted;
#ifdef RAWLOCK_SEM
        int r;
        Py_BEGIN_ALLOW_THREADS
        r = sem_wait(&self->sem);
        Py_END_ALLOW_THREADS
        interrupted = r != 0 && errno == EINTR;
#else
        PyLockStatus r;
        Py_BEGIN_ALLOW_THREADS
        r = PyThread_acquire_lock_timed(self->lock, -1, 1);
        Py_END_ALLOW_THREADS
        interrupted = r == PY_LOCK_INTR;
#endif
        if (!interrupted) {
            return 0;
        }
        if (PyErr_CheckSignals() < 0) {
            return -1;
        }
    }
}

/* Wait at most ``seconds`` (>= 0) without the GIL: 1 acquired, 0 timed out. */
static int
prim_wait_for(RawLock *self, double seconds)
{
    if (prim_try(self)) {
        return 1;
    }
    if (seconds <= 0.0) {
        return 0;
    }
#ifdef RAWLOCK_SEM
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    double whole = (double)deadline.tv_sec + seconds;
    /* Past ~292 years from now, wait "forever" in practice. */
    if (whole > 9.2e9) {
        whole = 9.2e9;
    }
    double secs = (double)(time_t)whole;
    long nsec = deadline.tv_nsec + (long)((whole - secs) * 1e9);
    deadline.tv_sec = (time_t)secs + nsec / 1000000000L;
    deadline.tv_nsec = nsec % 1000000000L;
    int r;
    /* Not interruptible: a signal is handled once this bounded wait ends. */
    do {
        Py_BEGIN_ALLOW_THREADS
        r = sem_clockwait(&self->sem, CLOCK_MONOTONIC, &deadline);
        Py_END_ALLOW_THREADS
    } while (r != 0 && errno == EINTR);
    return r == 0;
#else
    /* PY_TIMEOUT_MAX is in microseconds; anything longer waits as long as it can. */
    double us = seconds * 1e6;
    PY_TIMEOUT_T timeout = us >= (double)PY_TIMEOUT_MAX ? PY_TIMEOUT_MAX : (PY_TIMEOUT_T)us;
    PyLockStatus r;
    Py_BEGIN_ALLOW_THREADS
    r = PyThread_acquire_lock_timed(self->lock, timeout, 0);
    Py_END_ALLOW_THREADS
    return r == PY_LOCK_ACQUIRED;
#endif
}

static PyObject *
rawlock_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    if (PyTuple_GET_SIZE(args) != 0 || (kwds != NULL && PyDict_GET_SIZE(kwds) != 0)) {
        PyErr_SetString(PyExc_TypeError, "RawLock() takes no arguments");
        return NULL;
    }
    /* tp_alloc zero-fills: prim_fini is safe even if prim_init failed. */
    RawLock *self = (RawLock *)type->tp_alloc(type, 0);
    if (self == NULL) {
        return NULL;
    }
    if (prim_init(self) < 0) {
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

static void
rawlock_dealloc(RawLock *self)
{
    prim_fini(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *
rawlock_acquire(RawLock *self, PyObject *Py_UNUSED(ignored))
{
    if (!prim_try(self) && prim_wait(self) < 0) {
        return NULL;
    }
    self->locked = 1;
    Py_RETURN_TRUE;
}

static PyObject *
rawlock_try_acquire(RawLock *self, PyObject *Py_UNUSED(ignored))
{
    if (!prim_try(self)) {
        Py_RETURN_FALSE;
    }
    self->locked = 1;
    Py_RETURN_TRUE;
}

static PyObject *
rawlock_acquire_for(RawLock *self, PyObject *arg)
{
    double seconds = PyFloat_AsDouble(arg);
    if (seconds == -1.0 && PyErr_Occurred()) {
        return NULL;
    }
    if (!(seconds >= 0.0)) {  /* also NaN */
        PyErr_SetString(PyExc_ValueError, "timeout value must be a non-negative number");
        return NULL;
    }
    if (!prim_wait_for(self, seconds)) {
        Py_RETURN_FALSE;
    }
    self->locked = 1;
    Py_RETURN_TRUE;
}

static PyObject *
rawlock_release(RawLock *self, PyObject *Py_UNUSED(ignored))
{
    if (!self->locked) {
        PyErr_SetString(PyExc_RuntimeError, "release unlocked lock");
        return NULL;
    }
    self->locked = 0;
    prim_post(self);
    Py_RETURN_NONE;
}

static PyObject *
rawlock_locked(RawLock *self, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(self->locked);
}

static PyMethodDef rawlock_methods[] = {
    {"acquire", (PyCFunction)rawlock_acquire, METH_NOARGS,
     "acquire() -> True\n\nWait until the lock is free, then take it."},
    {"try_acquire", (PyCFunction)rawlock_try_acquire, METH_NOARGS,
     "try_acquire() -> bool\n\nTake the lock if it is free; never waits."},
    {"acquire_for", (PyCFunction)rawlock_acquire_for, METH_O,
     "acquire_for(seconds) -> bool\n\nWait at most this long for the lock."},
    {"release", (PyCFunction)rawlock_release, METH_NOARGS,
     "release()\n\nGive the lock back; RuntimeError if it is not held."},
    {"locked", (PyCFunction)rawlock_locked, METH_NOARGS,
     "locked() -> bool"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject RawLockType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "tickwheel._rawlock.RawLock",
    .tp_doc = "A non-reentrant lock with argument-free acquire() and release().",
    .tp_basicsize = sizeof(RawLock),
    .tp_itemsize = 0,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = rawlock_new,
    .tp_dealloc = (destructor)rawlock_dealloc,
    .tp_methods = rawlock_methods,
};

static struct PyModuleDef rawlock_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tickwheel._rawlock",
    .m_doc = "A lock whose uncontended acquire and release are one C call each.",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit__rawlock(void)
{
    if (PyType_Ready(&RawLockType) < 0) {
        return NULL;
    }
    PyObject *m = PyModule_Create(&rawlock_module);
    if (m == NULL) {
        return NULL;
    }
    Py_INCREF(&RawLockType);
    if (PyModule_AddObject(m, "RawLock", (PyObject *)&RawLockType) < 0) {
        Py_DECREF(&RawLockType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
