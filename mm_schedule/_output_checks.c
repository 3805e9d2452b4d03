/* The check of an encoder's list of outputs that needs nothing copied (mm_schedule/validate.py), in C.
 *
 * An encoder that returns one tensor per item hands the step a list whose every tensor is
 * checked before anything is cached: exactly a torch.Tensor, 2-D, its item's row count, the
 * step's hidden size, one floating dtype, the step's device, no autograd graph, and, to be
 * cached as it is, contiguous, not a negated view and alone in its storage. As bytecode that is
 * about ten attribute reads per tensor in a loop; here it is one pass, which also reads each
 * storage's address for the cache's reused-buffer check. Anything else returns None and the
 * Python checks decide tensor by tensor, with their error messages: this function raises
 * nothing for a bad tensor and changes nothing.
 *
 * Attribute reads of a tensor may run Python code (a torch function mode), so every object
 * is held strongly while it is used and the lists are re-read at every index.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *s_shape, *s_dtype, *s_device, *s_requires_grad, *s_is_neg, *s_is_contiguous,
    *s_untyped_storage, *s_nbytes, *s_data_ptr, *s_is_floating_point, *s_itemsize, *s_type, *s_meta, *s_cpu,
    *s_is_meta, *s_is_cpu;

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

/* 1 when calling name on obj returns exactly want (Py_True or Py_False), 0 when it returns anything
 * else, -1 with an exception set. */
static int method_is(PyObject *obj, PyObject *name, PyObject *want) {
    PyObject *got = PyObject_CallMethodNoArgs(obj, name);
    if (got == NULL) {
        return -1;
    }
    int same = got == want;
    Py_DECREF(got);
    return same;
}

static int attr_is(PyObject *obj, PyObject *name, PyObject *want) {
    PyObject *got = PyObject_GetAttr(obj, name);
    if (got == NULL) {
        return -1;
    }
    int same = got == want;
    Py_DECREF(got);
    return same;
}

/* An attribute read as a C long long; -1 with an exception set, or -2 when not an int. */
static long long int_of(PyObject *obj, PyObject *name, int call) {
    PyObject *got = call ? PyObject_CallMethodNoArgs(obj, name) : PyObject_GetAttr(obj, name);
    if (got == NULL) {
        return -1;
    }
    long long value = -2;
    if (PyLong_CheckExact(got)) {
        int overflow = 0;
        value = PyLong_AsLongLongAndOverflow(got, &overflow);
        if (overflow || value < 0) {
            value = -2;
        }
    }
    Py_DECREF(got);
    return value;
}

typedef struct {
    PyObject *dtype, *hidden, *device; /* strong references, NULL until the first tensor sets them */
    long long row_bytes;               /* hidden x itemsize */
    int meta;
    PyObject *same_device; /* a bool attribute true for a tensor on the layout's device (is_meta, is_cpu), or NULL */
} Layout;

/* 1: the first tensor's dtype (floating), hidden size (unless given), device (unless given, and not
 * meta then) set the layout; 0: not plain; -1: an exception. */
static int first_layout(Layout *layout, PyObject *dtype, PyObject *hidden, PyObject *device) {
    int floating = attr_is(dtype, s_is_floating_point, Py_True);
    if (floating != 1) {
        return floating;
    }
    long long itemsize = int_of(dtype, s_itemsize, 0);
    if (itemsize == -1 && PyErr_Occurred()) {
        return -1;
    }
    int overflow = 0;
    long long h = PyLong_AsLongLongAndOverflow(hidden, &overflow);
    if (itemsize <= 0 || overflow || h <= 0) {
        PyErr_Clear();
        return 0;
    }
    PyObject *type = PyObject_GetAttr(device, s_type);
    if (type == NULL) {
        return -1;
    }
    int meta = PyUnicode_Check(type) ? PyUnicode_Compare(type, s_meta) == 0 : -1;
    int cpu = PyUnicode_Check(type) ? PyUnicode_Compare(type, s_cpu) == 0 : -1;
    Py_DECREF(type);
    if (meta < 0 || cpu < 0) {
        PyErr_Clear();
        return 0;
    }
    /* Each of these devices is one of its kind: one bool read (no device object made) tells it. */
    layout->same_device = meta ? s_is_meta : cpu ? s_is_cpu : NULL;
    layout->dtype = Py_NewRef(dtype);
    layout->hidden = Py_NewRef(hidden);
    layout->device = Py_NewRef(device);
    layout->row_bytes = h * itemsize;
    layout->meta = meta;
    return 1;
}

/* 1 when tensor t is plain with `rows` rows of the layout (set from t when still empty), 0 when not,
 * -1 with an exception set. On 1, *storage is a new reference to the (device, address) of its
 * storage, or NULL on meta. */
static int plain_tensor(PyObject *t, PyObject *rows, Layout *layout, PyObject *want_hidden, PyObject *want_device,
                        PyObject **storage) {
    *storage = NULL;
    PyObject *shape = NULL, *dtype = NULL, *device = NULL, *held = NULL;
    int result = 0;
    shape = PyObject_GetAttr(t, s_shape);
    if (shape == NULL) {
        return -1;
    }
    if (!PyTuple_Check(shape) || PyTuple_GET_SIZE(shape) != 2 || !same_int(PyTuple_GET_ITEM(shape, 0), rows)) {
        goto done;
    }
    PyObject *hidden = PyTuple_GET_ITEM(shape, 1);
    if ((dtype = PyObject_GetAttr(t, s_dtype)) == NULL) {
        goto error;
    }
    if (layout->dtype != NULL && layout->same_device != NULL) {
        if (dtype != layout->dtype || !same_int(hidden, layout->hidden)) {
            goto done;
        }
        int same = attr_is(t, layout->same_device, Py_True);
        if (same != 1) {
            result = same;
            goto done;
        }
    } else if ((device = PyObject_GetAttr(t, s_device)) == NULL) {
        goto error;
    } else if (layout->dtype == NULL) {
        if (want_hidden != Py_None && !same_int(hidden, want_hidden)) {
            goto done;
        }
        if (want_device != Py_None) {
            int same = PyObject_RichCompareBool(device, want_device, Py_EQ);
            if (same != 1) {
                result = same;
                goto done;
            }
        }
        int set = first_layout(layout, dtype, hidden, device);
        if (set != 1 || (want_device == Py_None && layout->meta)) {
            result = set < 0 ? -1 : 0;
            goto done;
        }
    } else {
        if (dtype != layout->dtype || !same_int(hidden, layout->hidden)) {
            goto done;
        }
        int same = device == layout->device ? 1 : PyObject_RichCompareBool(device, layout->device, Py_EQ);
        if (same != 1) {
            result = same;
            goto done;
        }
    }
    int check;
    if ((check = attr_is(t, s_requires_grad, Py_False)) != 1 || (check = method_is(t, s_is_neg, Py_False)) != 1
        || (check = method_is(t, s_is_contiguous, Py_True)) != 1) {
        result = check;
        goto done;
    }
    if ((held = PyObject_CallMethodNoArgs(t, s_untyped_storage)) == NULL) {
        goto error;
    }
    long long nbytes = int_of(held, s_nbytes, 1);
    if (nbytes == -1 && PyErr_Occurred()) {
        goto error;
    }
    long long n = PyLong_AsLongLong(rows);
    if (n < 0 || nbytes != n * layout->row_bytes) {
        PyErr_Clear();
        goto done; /* a view of a larger storage: the cache copies it, tensor by tensor */
    }
    if (!layout->meta) {
        PyObject *address = PyObject_CallMethodNoArgs(held, s_data_ptr);
        if (address == NULL) {
            goto error;
        }
        *storage = PyTuple_Pack(2, layout->device, address);
        Py_DECREF(address);
        if (*storage == NULL) {
            goto error;
        }
    }
    result = 1;
    goto done;
error:
    result = -1;
done:
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    Py_XDECREF(device);
    Py_XDECREF(held);
    return result;
}

static PyObject *plain_outputs(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "plain_outputs(outputs, rows, hidden, device, tensor_type) takes 5 arguments,"
                     " got %zd", nargs);
        return NULL;
    }
    PyObject *outputs = args[0], *rows = args[1], *want_hidden = args[2], *want_device = args[3],
             *tensor_type = args[4];
    if (!PyList_CheckExact(outputs) || !PyList_CheckExact(rows) || !PyType_Check(tensor_type)) {
        PyErr_SetString(PyExc_TypeError, "plain_outputs: outputs and rows must be lists, tensor_type a type");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(outputs);
    if (n == 0 || PyList_GET_SIZE(rows) != n) {
        Py_RETURN_NONE;
    }
    Layout layout = {NULL, NULL, NULL, 0, 0, NULL};
    PyObject *storages = PyList_New(0), *result = NULL;
    if (storages == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (i >= PyList_GET_SIZE(outputs) || i >= PyList_GET_SIZE(rows)) {
            goto not_plain;
        }
        PyObject *t = Py_NewRef(PyList_GET_ITEM(outputs, i));
        PyObject *want_rows = Py_NewRef(PyList_GET_ITEM(rows, i));
        PyObject *storage = NULL;
        int plain = (PyObject *)Py_TYPE(t) == tensor_type
                        ? plain_tensor(t, want_rows, &layout, want_hidden, want_device, &storage)
                        : 0;
        Py_DECREF(t);
        Py_DECREF(want_rows);
        if (plain < 0) {
            goto error;
        }
        if (plain == 0) {
            goto not_plain;
        }
        if (storage != NULL) {
            int appended = PyList_Append(storages, storage);
            Py_DECREF(storage);
            if (appended < 0) {
                goto error;
            }
        }
    }
    result = Py_BuildValue("(OOOO)", layout.dtype, layout.hidden, layout.device, layout.meta ? Py_None : storages);
    goto finish;
not_plain:
    result = Py_NewRef(Py_None);
    goto finish;
error:
    result = NULL;
finish:
    Py_DECREF(storages);
    Py_XDECREF(layout.dtype);
    Py_XDECREF(layout.hidden);
    Py_XDECREF(layout.device);
    return result;
}

static PyMethodDef methods[] = {
    {"plain_outputs", (PyCFunction)(void (*)(void))plain_outputs, METH_FASTCALL,
     "plain_outputs(outputs, rows, hidden, device, tensor_type)\n\n"
     "(dtype, hidden, device, storages) when every outputs[i] is exactly tensor_type, 2-D with rows[i] rows\n"
     "and the hidden size (hidden, or the first tensor's when None), of one floating dtype, on device (or the\n"
     "first tensor's, not meta, when None), without grad, contiguous, not negated and alone in its storage;\n"
     "storages lists each storage's (device, data_ptr), None on meta. None when any is not (nothing raised\n"
     "for that)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_output_checks", "The check of encoder outputs that need no copy (see validate.py).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__output_checks(void) {
    if ((s_shape = PyUnicode_InternFromString("shape")) == NULL
        || (s_dtype = PyUnicode_InternFromString("dtype")) == NULL
        || (s_device = PyUnicode_InternFromString("device")) == NULL
        || (s_requires_grad = PyUnicode_InternFromString("requires_grad")) == NULL
        || (s_is_neg = PyUnicode_InternFromString("is_neg")) == NULL
        || (s_is_contiguous = PyUnicode_InternFromString("is_contiguous")) == NULL
        || (s_untyped_storage = PyUnicode_InternFromString("untyped_storage")) == NULL
        || (s_nbytes = PyUnicode_InternFromString("nbytes")) == NULL
        || (s_data_ptr = PyUnicode_InternFromString("data_ptr")) == NULL
        || (s_is_floating_point = PyUnicode_InternFromString("is_floating_point")) == NULL
        || (s_itemsize = PyUnicode_InternFromString("itemsize")) == NULL
        || (s_type = PyUnicode_InternFromString("type")) == NULL
        || (s_meta = PyUnicode_InternFromString("meta")) == NULL
        || (s_cpu = PyUnicode_InternFromString("cpu")) == NULL
        || (s_is_meta = PyUnicode_InternFromString("is_meta")) == NULL
        || (s_is_cpu = PyUnicode_InternFromString("is_cpu")) == NULL) {
        return NULL;
    }
    return PyModule_Create(&module);
}
