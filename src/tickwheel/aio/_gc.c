/* hide() and expose(): take an object out of the cyclic collector's view, and put it
 * back.
 *
 * Why it exists: a timer handle pending on the wheel of a running loop is reachable
 * from the loop, so no collection can free it, yet each full collection walks it: with
 * a million pending, those walks dominate a schedule+cancel run with the collector on
 * (docs/asyncio.md has the figures). The wheel hides a handle only while it is
 * pending and its loop is running, and exposes it again when it leaves the wheel or
 * the loop stops: a stopped loop dropped with pending handles is then collected as
 * the stock loop is.
 *
 * Both are the documented PyObject_GC_UnTrack and PyObject_GC_Track, guarded so that
 * each may be called on an object in either state (PyObject_GC_Track aborts on an
 * object already tracked). hidden() counts what is hidden, in every loop of the
 * process: at zero, a stopping loop need not walk its wheel.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* Objects hidden by hide() and not yet exposed: zero means no walk is needed to find
 * any (every caller holds the GIL). */
static Py_ssize_t hidden_count = 0;

static PyObject *
gc_hide(PyObject *module, PyObject *obj)
{
    if (PyObject_IS_GC(obj) && PyObject_GC_IsTracked(obj)) {
        PyObject_GC_UnTrack(obj);
        hidden_count++;
    }
    Py_RETURN_NONE;
}

static PyObject *
gc_expose(PyObject *module, PyObject *obj)
{
    if (PyObject_IS_GC(obj) && !PyObject_GC_IsTracked(obj)) {
        PyObject_GC_Track(obj);
        hidden_count--;
    }
    Py_RETURN_NONE;
}

static PyObject *
gc_hidden(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromSsize_t(hidden_count);
}

static PyMethodDef gc_methods[] = {
    {"hide", (PyCFunction)gc_hide, METH_O,
     "hide(obj)\n\nStop the cyclic collector from tracking obj (if it does)."},
    {"expose", (PyCFunction)gc_expose, METH_O,
     "expose(obj)\n\nMake the cyclic collector track obj again (if its type can be)."},
    {"hidden", (PyCFunction)gc_hidden, METH_NOARGS,
     "hidden() -> int\n\nHow many objects hide() took out that expose() has not put back."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef gc_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "tickwheel.aio._gc",
    .m_doc = "Hiding the pending handles of a running loop from the cyclic collector.",
    .m_size = -1,
    .m_methods = gc_methods,
};

PyMODINIT_FUNC
PyInit__gc(void)
{
    return PyModule_Create(&gc_module);
}
