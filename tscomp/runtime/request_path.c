/*
 * tscomp's request path in C (issue 10: per-call overhead). A CPython extension, built on the
 * serving machine by tscomp.runtime.request_path, that does per request what Runtime.run does in
 * Python before and after the host program: look the inputs up, check each one's type, rank and
 * fixed sizes, bind the shape symbols from their axes and check the declared ranges, allocate the
 * outputs (their shapes from the host program's tscomp_host_output_dims), put the addresses in the
 * pointer table, set the OpenMP thread count (tscomp_omp_use_threads, as set_num_threads does; one
 * thread for a short request that finds the team asleep: tscomp.runtime.solo_calls),
 * keep the workers off the caller's CPU (tscomp_team_enter) and make the one host-program call
 * with the GIL released.
 *
 * It decides nothing about a request the Python path does not (but its thread count): anything
 * unusual -- a missing or extra input, a non-ndarray, a wrong dtype or rank, a non-contiguous or
 * byte-swapped array, an axis that
 * disagrees with another, a value outside its range, an arena too small, a kernel's index error --
 * returns None, and the caller then runs the Python path, which raises the specific error or
 * handles the case (grows the arena, converts, runs out of range).
 *
 * The ts_call struct is the host program's (CALL_STRUCT, prepended by the builder).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#include <numpy/arrayobject.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define TS_MAX_RANK 32
#define TS_MAX_TERMS 8   /* symbols in one derived axis's expression (total = past + sequence: 2) */

typedef int (*ts_host_run)(int segment, const ts_call *call);
typedef int (*ts_output_dims)(int k, const int64_t *sym, int64_t *dims);
typedef int (*ts_team_enter)(int n);
typedef int (*ts_use_threads)(int n);
typedef int (*ts_relations)(const int64_t *sym);

typedef struct {
    PyObject *name;                 /* the graph input's name (a str) */
    int type_num, ndim, slot;       /* numpy type, rank, pointer-table slot */
    int axis_sym[TS_MAX_RANK];      /* the symbol an axis binds, or -1: a fixed size ... */
    int64_t axis_size[TS_MAX_RANK]; /* ... of this many (-2: derived, checked once all are bound) */
    int n_derived;                  /* axes that must equal an affine expression of the symbols: */
    int derived_axis[TS_MAX_RANK], n_terms[TS_MAX_RANK];
    int64_t derived_const[TS_MAX_RANK];                       /* c0 + sum c_k * sym[s_k] */
    int term_sym[TS_MAX_RANK][TS_MAX_TERMS];
    int64_t term_coef[TS_MAX_RANK][TS_MAX_TERMS];
} ts_input;

typedef struct {
    PyObject *name;
    int type_num, slot, index;      /* numpy type, pointer-table slot, graph output index */
} ts_output;

typedef struct {
    int n_inputs, n_outputs, n_symbols, threads;
    ts_input *inputs;
    ts_output *outputs;
    int64_t *lo, *hi;               /* each symbol's declared range */
    ts_host_run run;
    ts_output_dims output_dims;
    ts_use_threads use_threads;     /* the OpenMP thread count, set where it differs (build.py's) */
    ts_team_enter team_enter;
    ts_relations relations;         /* NULL: the model has none to check */
    /* solo calls (tscomp.runtime.solo_calls): a request of at most solo_max_elements input elements
     * (-1: none) runs on the calling thread alone while this thread's team is asleep (it last ran
     * more than solo_window_ns ago) -- in a run of requests that each follow the previous one within
     * the window, until the time they lost against an awake team (solo_loss times their own) adds
     * up to what waking it costs (solo_wake_ns); the next wakes the team */
    int64_t solo_window_ns, solo_max_elements, solo_wake_ns;
    double solo_loss;
} ts_model;

/* this thread's requests: when the last one with its OpenMP team ended (its workers spin from then
 * until the spin window passes, then sleep), when the last one of any kind ended, and the time the
 * current run of solo requests lost against an awake team */
static __thread int64_t team_last_ns = INT64_MIN / 2, call_last_ns = INT64_MIN / 2, solo_lost_ns = 0;

static void model_free(ts_model *m)
{
    if (!m) return;
    for (int i = 0; m->inputs && i < m->n_inputs; ++i) Py_XDECREF(m->inputs[i].name);
    for (int i = 0; m->outputs && i < m->n_outputs; ++i) Py_XDECREF(m->outputs[i].name);
    free(m->inputs); free(m->outputs); free(m->lo); free(m->hi);
    free(m);
}

static void capsule_free(PyObject *capsule)
{
    model_free((ts_model *)PyCapsule_GetPointer(capsule, "tscomp.request_path"));
}

static void *address(PyObject *obj)
{
    return PyLong_AsVoidPtr(obj);
}

/* model(inputs, outputs, lo, hi, threads, run, output_dims, use_threads, team_enter, relations) -> capsule
 *   inputs:  [(name, type_num, slot, (axis code, ...)), ...]; an axis code >= 0 is the symbol it
 *            binds, -1 - n a fixed size n, a tuple (c0, (symbol, coefficient), ...) an affine
 *            expression of symbols other axes bind (a derived dim: total = past + sequence)
 *   outputs: [(name, type_num, slot, graph output index), ...]
 *   lo, hi:  each symbol's range; run, output_dims, use_threads, team_enter, relations: function addresses
 *            (relations 0: none to check) */
static PyObject *model(PyObject *self, PyObject *args)
{
    PyObject *ins, *outs, *lo, *hi, *run, *dims, *use, *enter, *relations;
    int threads;
    if (!PyArg_ParseTuple(args, "O!O!O!O!iOOOOO", &PyList_Type, &ins, &PyList_Type, &outs, &PyList_Type, &lo,
                          &PyList_Type, &hi, &threads, &run, &dims, &use, &enter, &relations))
        return NULL;
    ts_model *m = calloc(1, sizeof *m);
    if (!m) return PyErr_NoMemory();
    m->n_inputs = (int)PyList_GET_SIZE(ins);
    m->n_outputs = (int)PyList_GET_SIZE(outs);
    m->n_symbols = (int)PyList_GET_SIZE(lo);
    m->threads = threads;
    m->inputs = calloc(m->n_inputs + 1, sizeof *m->inputs);
    m->outputs = calloc(m->n_outputs + 1, sizeof *m->outputs);
    m->lo = calloc(m->n_symbols + 1, sizeof *m->lo);
    m->hi = calloc(m->n_symbols + 1, sizeof *m->hi);
    if (!m->inputs || !m->outputs || !m->lo || !m->hi) { model_free(m); return PyErr_NoMemory(); }
    if (PyList_GET_SIZE(hi) != m->n_symbols) goto bad;
    for (int s = 0; s < m->n_symbols; ++s) {
        m->lo[s] = PyLong_AsLongLong(PyList_GET_ITEM(lo, s));
        m->hi[s] = PyLong_AsLongLong(PyList_GET_ITEM(hi, s));
    }
    for (int i = 0; i < m->n_inputs; ++i) {
        ts_input *in = &m->inputs[i];
        PyObject *axes;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(ins, i), "UiiO!", &in->name, &in->type_num, &in->slot, &PyTuple_Type, &axes))
            goto fail;
        Py_INCREF(in->name);
        in->ndim = (int)PyTuple_GET_SIZE(axes);
        if (in->ndim > TS_MAX_RANK) goto bad;
        for (int a = 0; a < in->ndim; ++a) {
            PyObject *item = PyTuple_GET_ITEM(axes, a);
            if (PyTuple_Check(item)) {       /* derived: (c0, (symbol, coefficient), ...) */
                const int d = in->n_derived++, n = (int)PyTuple_GET_SIZE(item) - 1;
                if (n < 0 || n > TS_MAX_TERMS) goto bad;
                in->axis_sym[a] = -1;
                in->axis_size[a] = -2;
                in->derived_axis[d] = a;
                in->n_terms[d] = n;
                in->derived_const[d] = PyLong_AsLongLong(PyTuple_GET_ITEM(item, 0));
                for (int k = 0; k < n; ++k) {
                    long long sk, ck;
                    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(item, k + 1), "LL", &sk, &ck)) goto fail;
                    if (sk < 0 || sk >= m->n_symbols) goto bad;
                    in->term_sym[d][k] = (int)sk;
                    in->term_coef[d][k] = ck;
                }
                continue;
            }
            long long code = PyLong_AsLongLong(item);
            if (code >= m->n_symbols) goto bad;
            in->axis_sym[a] = code >= 0 ? (int)code : -1;
            in->axis_size[a] = code >= 0 ? 0 : -1 - code;
        }
    }
    for (int k = 0; k < m->n_outputs; ++k) {
        ts_output *out = &m->outputs[k];
        if (!PyArg_ParseTuple(PyList_GET_ITEM(outs, k), "Uiii", &out->name, &out->type_num, &out->slot, &out->index))
            goto fail;
        Py_INCREF(out->name);
    }
    m->run = (ts_host_run)address(run);
    m->output_dims = (ts_output_dims)address(dims);
    m->use_threads = (ts_use_threads)address(use);
    m->team_enter = (ts_team_enter)address(enter);
    m->relations = (ts_relations)address(relations);
    if (PyErr_Occurred()) goto fail;
    if (!m->run || !m->output_dims || !m->use_threads) goto bad;
    PyObject *capsule = PyCapsule_New(m, "tscomp.request_path", capsule_free);
    if (!capsule) model_free(m);
    return capsule;
bad:
    PyErr_SetString(PyExc_ValueError, "request_path.model: malformed model description");
fail:
    model_free(m);
    return NULL;
}

/* Bind the symbols from the inputs' shapes into sym[] and their addresses into t[]: 0, or -1 when
 * anything is unusual (the Python path then says what). */
static int bind_inputs(const ts_model *m, PyObject *inputs, int64_t *sym, void **t, PyObject **held)
{
    if (!PyDict_CheckExact(inputs) || PyDict_GET_SIZE(inputs) != m->n_inputs) return -1;
    unsigned char seen[m->n_symbols + 1];      /* which symbols an axis has bound so far */
    memset(seen, 0, sizeof seen);
    for (int i = 0; i < m->n_inputs; ++i) {
        const ts_input *in = &m->inputs[i];
        PyObject *obj = PyDict_GetItemWithError(inputs, in->name);
        if (!obj || !PyArray_CheckExact(obj)) { PyErr_Clear(); return -1; }
        PyArrayObject *arr = (PyArrayObject *)obj;
        if (!PyArray_EquivTypenums(PyArray_TYPE(arr), in->type_num) || PyArray_NDIM(arr) != in->ndim
            || !PyArray_ISCARRAY_RO(arr) || !PyArray_ISNOTSWAPPED(arr))
            return -1;
        const npy_intp *shape = PyArray_DIMS(arr);
        for (int a = 0; a < in->ndim; ++a) {
            int s = in->axis_sym[a];
            if (s < 0) {
                if (in->axis_size[a] != -2 && shape[a] != in->axis_size[a]) return -1;
            } else if (seen[s]) {
                if (sym[s] != shape[a]) return -1;
            } else {
                sym[s] = shape[a];
                seen[s] = 1;
            }
        }
        t[in->slot] = PyArray_DATA(arr);
        held[i] = obj;
    }
    for (int s = 0; s < m->n_symbols; ++s)
        if (!seen[s] || sym[s] < m->lo[s] || sym[s] > m->hi[s]) return -1;
    for (int i = 0; i < m->n_inputs; ++i) {       /* derived axes, now that every symbol is bound */
        const ts_input *in = &m->inputs[i];
        for (int d = 0; d < in->n_derived; ++d) {
            int64_t want = in->derived_const[d];
            for (int k = 0; k < in->n_terms[d]; ++k) want += in->term_coef[d][k] * sym[in->term_sym[d][k]];
            if (PyArray_DIMS((PyArrayObject *)held[i])[in->derived_axis[d]] != want) return -1;
        }
    }
    return 0;
}

/* The outputs, allocated, their addresses in t[]: a new dict, NULL with no exception set when a
 * shape is not available here (the Python path then allocates), NULL with one on a failure. */
static PyObject *make_outputs(const ts_model *m, const int64_t *sym, void **t)
{
    PyObject *outputs = PyDict_New();
    if (!outputs) return NULL;
    for (int k = 0; k < m->n_outputs; ++k) {
        const ts_output *out = &m->outputs[k];
        int64_t dims[TS_MAX_RANK];
        npy_intp shape[TS_MAX_RANK];
        int nd = m->output_dims(out->index, sym, dims);
        if (nd < 0 || nd > TS_MAX_RANK) { Py_DECREF(outputs); return NULL; }
        for (int j = 0; j < nd; ++j) shape[j] = (npy_intp)dims[j];
        PyObject *arr = PyArray_SimpleNew(nd, shape, out->type_num);
        if (!arr) { Py_DECREF(outputs); return NULL; }
        t[out->slot] = PyArray_DATA((PyArrayObject *)arr);
        int rc = PyDict_SetItem(outputs, out->name, arr);
        Py_DECREF(arr);
        if (rc) { Py_DECREF(outputs); return NULL; }
    }
    return outputs;
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t input_elements(const ts_model *m, PyObject *const *held)
{
    int64_t n = 0;
    for (int i = 0; i < m->n_inputs; ++i) n += (int64_t)PyArray_SIZE((PyArrayObject *)held[i]);
    return n;
}

/* the OpenMP thread count of this request (see solo_window_ns). Back-to-back short requests keep
 * running solo until what they lost against the team would have paid for waking it: the
 * ski-rental rule, within 2x of knowing the run's length in advance. */
static int call_threads(const ts_model *m, PyObject *const *held, int64_t now)
{
    if (m->threads < 2 || m->solo_max_elements < 0 || now - team_last_ns <= m->solo_window_ns ||
        input_elements(m, held) > m->solo_max_elements)
        return m->threads;                          /* solo calls off, the workers still spin, or a long request */
    if (now - call_last_ns > m->solo_window_ns) solo_lost_ns = 0;   /* after a pause: a new run */
    return solo_lost_ns < m->solo_wake_ns ? 1 : m->threads;
}

/* run(model, inputs, call address) -> outputs dict, or None: take the Python path. The time inside
 * the host program goes to err[6] (ns), for the runtime's overhead report, its thread count to err[7]. */
static PyObject *run(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "request_path.run(model, inputs, call address)");
        return NULL;
    }
    const ts_model *m = PyCapsule_GetPointer(args[0], "tscomp.request_path");
    if (!m) return NULL;
    ts_call *call = PyLong_AsVoidPtr(args[2]);
    if (!call) return NULL;
    PyObject *held[m->n_inputs + 1];
    if (bind_inputs(m, args[1], (int64_t *)call->sym, call->t, held)) Py_RETURN_NONE;
    if (m->relations && m->relations(call->sym)) Py_RETURN_NONE;    /* the Python path names the relation */
    PyObject *outputs = make_outputs(m, call->sym, call->t);
    if (!outputs) {
        if (PyErr_Occurred()) return NULL;
        Py_RETURN_NONE;
    }
    for (int i = 0; i < m->n_inputs; ++i) Py_INCREF(held[i]);   /* the caller's dict may change meanwhile */
    int rc, threads;
    int64_t start, end;
    Py_BEGIN_ALLOW_THREADS
    threads = call_threads(m, held, now_ns());      /* the arrays are held: their sizes need no GIL */
    m->use_threads(threads);
    if (m->team_enter && threads > 1) m->team_enter(threads);
    start = now_ns();
    rc = m->run(0, call);
    end = now_ns();
    if (threads > 1) team_last_ns = end;
    else if (threads != m->threads) {
        solo_lost_ns += (int64_t)(m->solo_loss * (double)(end - start));
        m->use_threads(m->threads);                 /* the thread's setting stays the model's */
    }
    call_last_ns = end;
    Py_END_ALLOW_THREADS
    for (int i = 0; i < m->n_inputs; ++i) Py_DECREF(held[i]);
    call->err[6] = end - start;
    call->err[7] = threads;
    if (rc) {                       /* an arena to grow or an index error: the Python path handles it, */
        memset(call->err, 0, 6 * sizeof *call->err);   /* recording afresh (a checked kernel fails on any record) */
        Py_DECREF(outputs);
        Py_RETURN_NONE;
    }
    return outputs;
}

/* set_solo(model, window_ns, max_elements, wake_ns, loss): the solo-call policy (-1 elements: never) */
static PyObject *set_solo(PyObject *self, PyObject *args)
{
    PyObject *capsule;
    long long window, elements, wake;
    double loss;
    if (!PyArg_ParseTuple(args, "OLLLd", &capsule, &window, &elements, &wake, &loss)) return NULL;
    ts_model *m = PyCapsule_GetPointer(capsule, "tscomp.request_path");
    if (!m) return NULL;
    m->solo_window_ns = window;
    m->solo_max_elements = elements;
    m->solo_wake_ns = wake;
    m->solo_loss = loss;
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"model", model, METH_VARARGS, "A model's description for run() (a capsule)."},
    {"set_solo", set_solo, METH_VARARGS, "The solo-call policy: set_solo(model, window_ns, max_elements, wake_ns, loss)."},
    {"run", (PyCFunction)(void (*)(void))run, METH_FASTCALL, "One request: outputs dict, or None (take the Python path)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "tscomp_request_path", NULL, -1, methods,
                                    NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit_tscomp_request_path(void)
{
    import_array();
    return PyModule_Create(&module);
}
