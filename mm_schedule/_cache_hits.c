/* The embedding cache's steady-state lookup (mm_schedule/cache.py, EmbeddingCache.lookup_all), in C.
 *
 * A step whose thousand items are all cached spends its lookup in per-key passes over the
 * keys: fetch every entry, read its row count, compare the counts with the plan's, read its
 * tensor. As separate C-level passes (map, list comparison) that is four walks over entries
 * that have gone cold in the CPU's caches since the last step; this is one. It answers only
 * the steady state: every key held, each entry a tuple with the expected rows. Anything else
 * returns None and the cache's Python loop decides key by key (misses, mismatched rows,
 * entries of another modality, discards), so this function never changes the cache.
 *
 * The keys are the plan's exact ints; an entry is held strongly from the moment it is found,
 * because comparing keys of one dictionary bucket may run Python code (a key of another type
 * with its own __eq__) that could drop it.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

/* 1 when obj is an exact int equal to want (also exact); 0 otherwise. Runs no Python code. */
static int same_int(PyObject *obj, PyObject *want) {
    if (obj == want) {
        return 1;
    }
    if (!PyLong_CheckExact(obj) || !PyLong_CheckExact(want)) {
        return 0;
    }
    int overflow_a = 0, overflow_b = 0;
    long long a = PyLong_AsLongLongAndOverflow(obj, &overflow_a);
    long long b = PyLong_AsLongLongAndOverflow(want, &overflow_b);
    return !overflow_a && !overflow_b && a == b && !(a == -1 && PyErr_Occurred());
}

/* 1 when an entry of modality `held` may serve a key asked for as `wanted`: the same exact str, or
 * an entry set without a modality (None). Runs no Python code. */
static int same_modality(PyObject *held, PyObject *wanted) {
    if (held == wanted || held == Py_None) {
        return 1;
    }
    return PyUnicode_CheckExact(held) && PyUnicode_CheckExact(wanted) && PyUnicode_Compare(held, wanted) == 0;
}

static PyObject *all_hits(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "all_hits(entries, keys, rows, modalities, tensor_index, rows_index,"
                     " modality_index, address_index) takes 8 arguments, got %zd", nargs);
        return NULL;
    }
    PyObject *entries = args[0], *keys = args[1], *rows = args[2], *modalities = args[3];
    if (!PyDict_Check(entries) || !PyList_CheckExact(keys) || !PyList_CheckExact(rows)
        || (modalities != Py_None && !PyList_CheckExact(modalities))) {
        PyErr_SetString(PyExc_TypeError, "all_hits: entries must be a dict, keys and rows lists, modalities a list"
                        " or None");
        return NULL;
    }
    Py_ssize_t tensor_index = PyLong_AsSsize_t(args[4]), rows_index = PyLong_AsSsize_t(args[5]),
               modality_index = PyLong_AsSsize_t(args[6]), address_index = PyLong_AsSsize_t(args[7]);
    if ((tensor_index == -1 || rows_index == -1 || modality_index == -1 || address_index == -1) && PyErr_Occurred()) {
        return NULL;
    }
    if (tensor_index < 0 || rows_index < 0 || modality_index < 0 || address_index < 0) {
        PyErr_SetString(PyExc_ValueError, "all_hits: indices must be non-negative");
        return NULL;
    }
    Py_ssize_t needed = (tensor_index > rows_index ? tensor_index : rows_index) + 1;
    if (modality_index + 1 > needed) {
        needed = modality_index + 1;
    }
    if (address_index + 1 > needed) {
        needed = address_index + 1;
    }
    Py_ssize_t n = PyList_GET_SIZE(keys);
    if (PyList_GET_SIZE(rows) != n || (modalities != Py_None && PyList_GET_SIZE(modalities) != n)) {
        Py_RETURN_NONE;
    }
    PyObject *out = PyList_New(n), *addresses = PyList_New(n);
    if (out == NULL || addresses == NULL) {
        Py_XDECREF(out);
        Py_XDECREF(addresses);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        /* Re-read every time: the lists are the caller's, and a key comparison may run code. */
        if (i >= PyList_GET_SIZE(keys) || i >= PyList_GET_SIZE(rows)) {
            goto not_steady;
        }
        PyObject *key = PyList_GET_ITEM(keys, i);
        if (!PyLong_CheckExact(key)) {
            goto not_steady;
        }
        Py_INCREF(key);
        PyObject *entry = PyDict_GetItemWithError(entries, key);
        Py_DECREF(key);
        if (entry == NULL) {
            if (PyErr_Occurred()) {
                Py_DECREF(out);
                Py_DECREF(addresses);
                return NULL;
            }
            goto not_steady;
        }
        Py_INCREF(entry);
        if (!PyTuple_CheckExact(entry) || PyTuple_GET_SIZE(entry) < needed || i >= PyList_GET_SIZE(rows)
            || !same_int(PyTuple_GET_ITEM(entry, rows_index), PyList_GET_ITEM(rows, i))
            || (modalities != Py_None && (i >= PyList_GET_SIZE(modalities)
                || !same_modality(PyTuple_GET_ITEM(entry, modality_index), PyList_GET_ITEM(modalities, i))))) {
            Py_DECREF(entry);
            goto not_steady;
        }
        PyObject *address = PyTuple_GET_ITEM(entry, address_index);
        if (!PyLong_CheckExact(address)) {
            Py_DECREF(entry);
            goto not_steady;
        }
        PyList_SET_ITEM(out, i, Py_NewRef(PyTuple_GET_ITEM(entry, tensor_index)));
        PyList_SET_ITEM(addresses, i, Py_NewRef(address));
        Py_DECREF(entry);
    }
    return Py_BuildValue("(NN)", out, addresses);
not_steady:
    Py_DECREF(out); /* unset slots are NULL, which list deallocation skips */
    Py_DECREF(addresses);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"all_hits", (PyCFunction)(void (*)(void))all_hits, METH_FASTCALL,
     "all_hits(entries, keys, rows, modalities, tensor_index, rows_index, modality_index, address_index)\n\n"
     "([entries[k][tensor_index] for k in keys], [entries[k][address_index] for k in keys]) when every key\n"
     "is an int held in entries by a tuple whose entry[rows_index] equals rows[i], whose\n"
     "entry[modality_index] is modalities[i] or None (modalities None: any) and whose entry[address_index]\n"
     "is an int; None otherwise (the caller then looks the keys up one by one)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cache_hits", "The embedding cache's steady-state lookup (see cache.py).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cache_hits(void) {
    return PyModule_Create(&module);
}
