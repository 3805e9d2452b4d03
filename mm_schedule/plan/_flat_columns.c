/* The flat planner's pass over a step's items (mm_schedule/plan/flat.py), in C.
 *
 * A step with a thousand cached images spends most of its host time in this loop when it
 * runs as Python bytecode: four attribute reads, a dictionary probe and a handful of list
 * appends per item, each paying the interpreter's dispatch. This is the same pass, the
 * same checks in the same order, building the same Python lists; flat.py keeps the Python
 * version for installs without a compiler, and the test-suite runs both on one set of
 * inputs and requires identical columns, the same give-ups and the same exceptions.
 *
 * Result: None where the step is not the flat shape (the general planner then plans it and
 * says what is wrong), else the tuple of columns flat.py assembles into a StepPlan. An
 * AttributeError, TypeError or ValueError met on the way means "not the flat shape" too;
 * any other exception propagates, as from the Python loop.
 *
 * Integers are handled as int64 only inside [-2**60, 2**60], where no sum below can
 * overflow; anything larger, and spans that are not (start, end) tuples or lists, go to
 * the general planner instead of being narrowed. The GIL is held throughout; attribute
 * reads, comparisons, hashing and len() may run the user's Python code (a property, an
 * __ne__ that replaces the span being compared), so no borrowed reference is held across
 * any of them: span ends are copied to C integers first, compared as fresh ints, and the
 * caller's span objects are held strongly while their comparison runs.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>

#define LIMIT ((int64_t)1 << 60)

static PyObject *s_precomputed, *s_offsets, *s_hash, *s_modality;

/* 1 and *out set when obj is an exact int within LIMIT; 0 otherwise (no error set). */
static int small_int(PyObject *obj, int64_t *out) {
    if (!PyLong_CheckExact(obj)) {
        return 0;
    }
    int overflow = 0;
    long long v = PyLong_AsLongLongAndOverflow(obj, &overflow);
    if (overflow || v > LIMIT || v < -LIMIT) {
        return 0;
    }
    *out = (int64_t)v;
    return 1;
}

/* The two ends of a span given as an exact tuple or list of two; 0 when it is not one. */
static int span_pair(PyObject *span, PyObject **start, PyObject **end) {
    if (PyTuple_CheckExact(span) && PyTuple_GET_SIZE(span) == 2) {
        *start = PyTuple_GET_ITEM(span, 0);
        *end = PyTuple_GET_ITEM(span, 1);
        return 1;
    }
    if (PyList_CheckExact(span) && PyList_GET_SIZE(span) == 2) {
        *start = PyList_GET_ITEM(span, 0);
        *end = PyList_GET_ITEM(span, 1);
        return 1;
    }
    return 0;
}

static int append_new(PyObject *list, PyObject *value) {
    if (value == NULL) {
        return -1;
    }
    int rc = PyList_Append(list, value);
    Py_DECREF(value);
    return rc;
}

static int append_repeated(PyObject *list, Py_ssize_t value, Py_ssize_t times) {
    if (times <= 0) {
        return 0;
    }
    PyObject *boxed = PyLong_FromSsize_t(value);
    if (boxed == NULL) {
        return -1;
    }
    for (Py_ssize_t i = 0; i < times; i++) {
        if (PyList_Append(list, boxed) < 0) {
            Py_DECREF(boxed);
            return -1;
        }
    }
    Py_DECREF(boxed);
    return 0;
}

/* ``given != value`` as Python evaluates it (the caller's object may define __ne__),
 * against a fresh int: 1, 0, or -1 with an exception set. An exact int runs no code of
 * the caller's, so it is compared as a C integer. */
static int compare_end(PyObject *given, int64_t value) {
    int64_t exact;
    if (small_int(given, &exact)) {
        return exact != value;
    }
    PyObject *boxed = PyLong_FromLongLong(value);
    if (boxed == NULL) {
        return -1;
    }
    PyObject *result = PyObject_RichCompare(given, boxed, Py_NE);
    Py_DECREF(boxed);
    if (result == NULL) {
        return -1;
    }
    int truth = PyObject_IsTrue(result);
    Py_DECREF(result);
    return truth;
}

/* seq[r] as a new reference: read straight from an exact list or tuple when r is in range,
 * else through Python's indexing (which raises what ``seq[r]`` raises in the Python pass). */
static PyObject *element(PyObject *seq, Py_ssize_t r) {
    if (PyList_CheckExact(seq) && r < PyList_GET_SIZE(seq)) {
        return Py_NewRef(PyList_GET_ITEM(seq, r));
    }
    if (PyTuple_CheckExact(seq) && r < PyTuple_GET_SIZE(seq)) {
        return Py_NewRef(PyTuple_GET_ITEM(seq, r));
    }
    PyObject *index = PyLong_FromSsize_t(r);
    if (index == NULL) {
        return NULL;
    }
    PyObject *value = PyObject_GetItem(seq, index);
    Py_DECREF(index);
    return value;
}

/* The int i as a new reference, from a list of 0, 1, 2, ... kept for the process: a step's
 * source numbers then allocate (and later free) no int each. Only this module's calls grow
 * it, with the GIL held and no Python code run meanwhile. */
static PyObject *counting = NULL;

static PyObject *index_object(Py_ssize_t i) {
    if (counting == NULL && (counting = PyList_New(0)) == NULL) {
        return NULL;
    }
    while (PyList_GET_SIZE(counting) <= i) {
        if (append_new(counting, PyLong_FromSsize_t(PyList_GET_SIZE(counting))) < 0) {
            return NULL;
        }
    }
    return Py_NewRef(PyList_GET_ITEM(counting, i));
}

enum { OK = 0, GIVE_UP = 1, FAILED = -1 };

typedef struct {
    PyObject *keys, *rows, *requests, *modalities, *first_items, *seg_token_row, *seg_request, *odd;
    PyObject *source_of;
    PyObject *names, *modality_name, *item_key;
    PyObject *last_modality, *last_name; /* strong references, or NULL */
    Py_ssize_t n_sources;
} Columns;

/* c->last_name set to the name of item.modality (the last one looked up is kept). */
static int item_modality(Columns *c, PyObject *item) {
    PyObject *m = PyObject_GetAttr(item, s_modality);
    if (m == NULL) {
        return -1;
    }
    if (m != c->last_modality) {
        int known = PyDict_Contains(c->names, m);
        if (known < 0) {
            Py_DECREF(m);
            return -1;
        }
        PyObject *name = known ? PyObject_GetItem(c->names, m) : PyObject_CallOneArg(c->modality_name, m);
        if (name == NULL) {
            Py_DECREF(m);
            return -1;
        }
        Py_XSETREF(c->last_name, name);
        Py_XSETREF(c->last_modality, m); /* the reference GetAttr returned */
        return 0;
    }
    Py_DECREF(m);
    return 0;
}

/* One item of request r. */
static int plan_item(Columns *c, PyObject *item, Py_ssize_t r, PyObject *given, Py_ssize_t *k, int64_t *prev_end,
                     int64_t prefix, int64_t end, int64_t token_shift) {
    int status = FAILED;
    PyObject *offsets = NULL, *h = NULL;
    PyObject *pre = PyObject_GetAttr(item, s_precomputed);
    if (pre == NULL) {
        return FAILED;
    }
    int has_pre = pre != Py_None;
    Py_DECREF(pre);
    if (has_pre) {
        return GIVE_UP;
    }
    offsets = PyObject_GetAttr(item, s_offsets);
    if (offsets == NULL) {
        return FAILED;
    }
    PyObject *span;
    if (PyList_CheckExact(offsets) && PyList_GET_SIZE(offsets) == 1) {
        span = PyList_GET_ITEM(offsets, 0);
    } else if (PyTuple_CheckExact(offsets) && PyTuple_GET_SIZE(offsets) == 1) {
        span = PyTuple_GET_ITEM(offsets, 0);
    } else {
        status = GIVE_UP; /* not a list or tuple, or not exactly one span */
        goto done;
    }
    PyObject *s_obj, *e_obj;
    int64_t s, e;
    if (!span_pair(span, &s_obj, &e_obj) || !small_int(s_obj, &s) || !small_int(e_obj, &e) || s <= *prev_end
        || e < s) {
        status = GIVE_UP;
        goto done;
    }
    /* s_obj and e_obj are borrowed from the item's span, which the Python code below may
     * replace: from here on only the C copies s and e are used. */
    if (given != Py_None) {
        Py_INCREF(span); /* held: reading ``given`` may run code that drops it from the item */
        PyObject *g = element(given, *k);
        int same = g == span && PyTuple_CheckExact(span); /* a tuple: nothing can have changed its ends */
        Py_DECREF(span);
        if (g == NULL) {
            goto done;
        }
        PyObject *gs, *ge;
        int differs = 1;
        if (same) {
            differs = 0; /* the item's own span object, as SGLang's flattened offsets hold it */
        } else if (span_pair(g, &gs, &ge)) {
            Py_INCREF(gs);
            Py_INCREF(ge);
            differs = compare_end(gs, s);
            if (differs == 0) {
                differs = compare_end(ge, e);
            }
            Py_DECREF(gs);
            Py_DECREF(ge);
        }
        Py_DECREF(g);
        if (differs < 0) {
            goto done;
        }
        if (differs) {
            status = GIVE_UP; /* another span than the item's (or not a pair: the general planner says) */
            goto done;
        }
        *k += 1;
    }
    *prev_end = e;
    if (e < prefix || s >= end) {
        status = OK; /* outside this chunk: no lookup, no encode */
        goto done;
    }
    h = PyObject_GetAttr(item, s_hash);
    if (h == NULL) {
        goto done;
    }
    if (!PyLong_CheckExact(h)) {
        PyObject *request = PyLong_FromSsize_t(r);
        if (request == NULL) {
            goto done;
        }
        PyObject *key = PyObject_CallFunctionObjArgs(c->item_key, h, request, NULL);
        Py_DECREF(request);
        if (key == NULL) {
            goto done;
        }
        Py_SETREF(h, key);
    }
    int64_t n = e - s + 1;
    int whole = s >= prefix && e < end;
    /* One probe finds the hash's source or makes it the next one: keys are exact ints, whose
     * hashing and comparison run no code of the caller's. */
    PyObject *next = index_object(c->n_sources);
    if (next == NULL) {
        goto done;
    }
    PyObject *found = PyDict_SetDefault(c->source_of, h, next);
    int added = found == next;
    Py_DECREF(next); /* the dict holds it when it was added */
    if (found == NULL) {
        goto done;
    }
    Py_ssize_t source;
    int is_new;
    if (added) {
        source = c->n_sources;
        c->n_sources += 1;
        if (append_new(c->rows, PyLong_FromLongLong(n)) < 0 || PyList_Append(c->keys, h) < 0) {
            goto done;
        }
        if (item_modality(c, item) < 0) {
            goto done;
        }
        if (PyList_Append(c->modalities, c->last_name) < 0 || PyList_Append(c->first_items, item) < 0) {
            goto done;
        }
        if (whole) {
            status = append_new(c->seg_token_row, PyLong_FromLongLong(s + token_shift)) < 0 ? FAILED : OK;
            goto done;
        }
        is_new = 1;
    } else {
        source = PyLong_AsSsize_t(found);
        if (source == -1 && PyErr_Occurred()) {
            goto done;
        }
        long long planned = PyLong_AsLongLong(PyList_GET_ITEM(c->rows, source));
        if (planned == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (planned != n) {
            status = GIVE_UP; /* one hash, two lengths: the general planner keeps them apart */
            goto done;
        }
        if (item_modality(c, item) < 0) {
            goto done;
        }
        PyObject *first_name = Py_NewRef(PyList_GET_ITEM(c->modalities, source));
        int differs = PyObject_RichCompareBool(c->last_name, first_name, Py_NE);
        Py_DECREF(first_name);
        if (differs != 0) {
            status = differs < 0 ? FAILED : GIVE_UP; /* one hash, two modalities: the general planner refuses it */
            goto done;
        }
        is_new = 0;
    }
    int64_t lo = whole ? s : (s > prefix ? s : prefix);
    int64_t hi = whole ? e : (e < end ? e : end - 1);
    PyObject *entry = Py_BuildValue("(nnLLOO)", PyList_GET_SIZE(c->seg_token_row), source, (long long)(lo - s),
                                    (long long)(hi - lo + 1), item, is_new ? Py_True : Py_False);
    if (append_new(c->odd, entry) < 0 || append_new(c->seg_token_row, PyLong_FromLongLong(lo + token_shift)) < 0) {
        goto done;
    }
    status = OK;
done:
    Py_XDECREF(offsets);
    Py_XDECREF(h);
    return status;
}

/* Where request r's items lie in ``flat`` (the private copy of SGLang's ``embedding_items``):
 * ``[*lo, *hi)``, what ``flat[bounds[r]:bounds[r + 1]]`` selects. ``bounds`` is the private
 * copy too, every one of them checked a non-negative int within LIMIT; 0 all the same if
 * one is not (the caller slices in Python then, with Python's rules). */
static int request_range(PyObject *flat, PyObject *bounds, Py_ssize_t r, Py_ssize_t *lo, Py_ssize_t *hi) {
    int64_t start, stop;
    PyObject *lo_obj = PyList_GET_ITEM(bounds, r), *hi_obj = PyList_GET_ITEM(bounds, r + 1);
    if (!small_int(lo_obj, &start) || !small_int(hi_obj, &stop) || start < 0 || stop < 0) {
        return 0;
    }
    Py_ssize_t n = PyList_GET_SIZE(flat);
    *lo = start < n ? (Py_ssize_t)start : n;
    *hi = stop < n ? (Py_ssize_t)stop : n;
    if (*hi < *lo) {
        *hi = *lo;
    }
    return 1;
}

/* One request: its checks, then its items. ``flat`` and ``bounds`` (both NULL unless the
 * step's items come as one list) say where request r's items are. */
static int plan_request(Columns *c, PyObject *args[], Py_ssize_t r, int64_t *token_base, PyObject *flat,
                        PyObject *bounds) {
    int status = FAILED;
    PyObject *prefix_obj = NULL, *extend_obj = NULL, *row_obj = NULL, *items = NULL, *given = NULL, *it = NULL;
    Py_ssize_t lo = 0, hi = 0;
    if ((prefix_obj = element(args[1], r)) == NULL || (extend_obj = element(args[2], r)) == NULL
        || (row_obj = element(args[4], r)) == NULL) {
        goto done;
    }
    int64_t prefix, extend, row_offset;
    if (!small_int(prefix_obj, &prefix) || !small_int(extend_obj, &extend) || prefix < 0) {
        status = GIVE_UP;
        goto done;
    }
    if (row_obj == Py_None) {
        row_offset = *token_base;
    } else if (!small_int(row_obj, &row_offset)) {
        status = GIVE_UP;
        goto done;
    }
    if (flat != NULL) {
        if (!request_range(flat, bounds, r, &lo, &hi)) {
            status = GIVE_UP;
            goto done;
        }
    } else if ((items = element(args[0], r)) == NULL) {
        goto done;
    }
    if (extend <= 0) {
        status = OK;
        goto done;
    }
    *token_base += extend;
    if (*token_base > LIMIT) {
        status = GIVE_UP;
        goto done;
    }
    int nonempty = items == NULL ? hi > lo : PyObject_IsTrue(items);
    if (nonempty <= 0) {
        status = nonempty < 0 ? FAILED : OK;
        goto done;
    }
    if ((given = element(args[3], r)) == NULL) {
        goto done;
    }
    if (given != Py_None) {
        Py_ssize_t n_given = PyObject_Length(given), n_items = hi - lo;
        if (n_given < 0 || (items != NULL && (n_items = PyObject_Length(items)) < 0)) {
            goto done;
        }
        if (n_given != n_items) {
            status = GIVE_UP;
            goto done;
        }
    }
    int64_t end = prefix + extend, token_shift = row_offset - prefix, prev_end = -1;
    Py_ssize_t k = 0;
    Py_ssize_t first_segment = PyList_GET_SIZE(c->seg_token_row), first_source = PyList_GET_SIZE(c->keys);
    if (items == NULL) {
        /* flat is this call's own copy: nothing the users' code runs can change it */
        for (Py_ssize_t i = lo; i < hi; i++) {
            PyObject *item = Py_NewRef(PyList_GET_ITEM(flat, i));
            int item_status = plan_item(c, item, r, given, &k, &prev_end, prefix, end, token_shift);
            Py_DECREF(item);
            if (item_status != OK) {
                status = item_status;
                goto done;
            }
        }
    } else {
        if ((it = PyObject_GetIter(items)) == NULL) {
            goto done;
        }
        PyObject *item;
        while ((item = PyIter_Next(it)) != NULL) {
            int item_status = plan_item(c, item, r, given, &k, &prev_end, prefix, end, token_shift);
            Py_DECREF(item);
            if (item_status != OK) {
                status = item_status;
                goto done;
            }
        }
        if (PyErr_Occurred()) {
            goto done;
        }
    }
    if (append_repeated(c->requests, r, PyList_GET_SIZE(c->keys) - first_source) < 0
        || append_repeated(c->seg_request, r, PyList_GET_SIZE(c->seg_token_row) - first_segment) < 0) {
        goto done;
    }
    status = OK;
done:
    Py_XDECREF(prefix_obj);
    Py_XDECREF(extend_obj);
    Py_XDECREF(row_obj);
    Py_XDECREF(items);
    Py_XDECREF(given);
    Py_XDECREF(it);
    return status;
}

static PyObject *flat_columns(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8 && nargs != 9) {
        PyErr_Format(PyExc_TypeError,
                     "flat_columns(item_lists, prefixes, extends, offsets_lists, row_offsets, names,"
                     " modality_name, item_key[, bounds]) takes 8 or 9 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *bounds = nargs == 9 && args[8] != Py_None ? args[8] : NULL;
    if (bounds != NULL && (!PyList_CheckExact(bounds) || !PyList_CheckExact(args[0]))) {
        PyErr_SetString(PyExc_TypeError, "flat_columns: with bounds, item_lists and bounds must be lists");
        return NULL;
    }
    if (!PyDict_Check(args[5])) {
        PyErr_SetString(PyExc_TypeError, "flat_columns: names must be a dict");
        return NULL;
    }
    Columns c = {0};
    c.names = args[5];
    c.modality_name = args[6];
    c.item_key = args[7];
    PyObject *result = NULL;
    int status = FAILED;
    if ((c.keys = PyList_New(0)) == NULL || (c.rows = PyList_New(0)) == NULL || (c.requests = PyList_New(0)) == NULL
        || (c.modalities = PyList_New(0)) == NULL || (c.first_items = PyList_New(0)) == NULL
        || (c.seg_token_row = PyList_New(0)) == NULL || (c.seg_request = PyList_New(0)) == NULL
        || (c.odd = PyList_New(0)) == NULL || (c.source_of = PyDict_New()) == NULL) {
        goto done;
    }
    /* With bounds, the flat list and the bounds are copied first, and every bound is read
     * before any request: each request's slice is then what slicing them all up front
     * gives (the Python pass), whatever the users' code run on the way does to either. */
    PyObject *flat = NULL, *own_bounds = NULL;
    if (bounds != NULL) {
        if ((flat = PyList_GetSlice(args[0], 0, PyList_GET_SIZE(args[0]))) == NULL
            || (own_bounds = PyList_GetSlice(bounds, 0, PyList_GET_SIZE(bounds))) == NULL) {
            Py_XDECREF(flat);
            goto done;
        }
        for (Py_ssize_t b = 0; b < PyList_GET_SIZE(own_bounds); b++) {
            int64_t value;
            if (!small_int(PyList_GET_ITEM(own_bounds, b), &value) || value < 0) {
                status = GIVE_UP; /* slices with Python's rules for other bounds: the general planner's */
                break;
            }
        }
    }
    Py_ssize_t n_requests = bounds == NULL ? PyObject_Length(args[0])
                            : PyList_GET_SIZE(own_bounds) > 0 ? PyList_GET_SIZE(own_bounds) - 1 : 0;
    int64_t token_base = 0;
    if (status != GIVE_UP) {
        status = n_requests < 0 ? FAILED : OK;
    }
    for (Py_ssize_t r = 0; r < n_requests && status == OK; r++) {
        status = plan_request(&c, (PyObject **)args, r, &token_base, flat, own_bounds);
    }
    Py_XDECREF(flat);
    Py_XDECREF(own_bounds);
    if (status == OK) {
        result = Py_BuildValue("(OOOOOOOOL)", c.keys, c.rows, c.requests, c.modalities, c.first_items,
                               c.seg_token_row, c.seg_request, c.odd, (long long)token_base);
    }
done:
    if (status == FAILED && (PyErr_ExceptionMatches(PyExc_AttributeError) || PyErr_ExceptionMatches(PyExc_TypeError)
                             || PyErr_ExceptionMatches(PyExc_ValueError))) {
        PyErr_Clear(); /* not the flat shape, or malformed: the general planner says which */
        status = GIVE_UP;
    }
    if (status == GIVE_UP) {
        result = Py_NewRef(Py_None);
    }
    Py_XDECREF(c.keys);
    Py_XDECREF(c.rows);
    Py_XDECREF(c.requests);
    Py_XDECREF(c.modalities);
    Py_XDECREF(c.first_items);
    Py_XDECREF(c.seg_token_row);
    Py_XDECREF(c.seg_request);
    Py_XDECREF(c.odd);
    Py_XDECREF(c.source_of);
    Py_XDECREF(c.last_modality);
    Py_XDECREF(c.last_name);
    return result;
}

static PyMethodDef methods[] = {
    {"flat_columns", (PyCFunction)(void (*)(void))flat_columns, METH_FASTCALL,
     "flat_columns(item_lists, prefixes, extends, offsets_lists, row_offsets, names, modality_name, item_key"
     "[, bounds])\n\n"
     "The flat planner's columns (keys, rows, requests, modalities, first_items, seg_token_row,\n"
     "seg_request, odd, n_tokens), or None when the step is not the flat shape. With bounds (a list),\n"
     "item_lists is one flat list and request r's items are item_lists[bounds[r]:bounds[r + 1]]."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_flat_columns", "The flat planner's pass over a step's items (see plan/flat.py).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__flat_columns(void) {
    if ((s_precomputed = PyUnicode_InternFromString("precomputed_embeddings")) == NULL
        || (s_offsets = PyUnicode_InternFromString("offsets")) == NULL
        || (s_hash = PyUnicode_InternFromString("hash")) == NULL
        || (s_modality = PyUnicode_InternFromString("modality")) == NULL) {
        return NULL;
    }
    return PyModule_Create(&module);
}
