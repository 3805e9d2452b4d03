/* Placeholder-token membership on the CPU in one pass over input_ids.
 *
 * A step with a thousand images brings a thousand placeholder ids (one per item), and
 * input_ids holds tens of thousands of tokens. Done with torch ops, the test costs about
 * six full passes over input_ids plus a dozen small calls to build a table, each paying
 * a dispatch that dominates once the CPU caches hold other work. Here the ids go into
 * an open-addressing hash set (linear probing, load at most one half) and every token
 * is looked up once; a run of equal tokens (an image's placeholders) is looked up once
 * per run.
 *
 * The multiplier of the hash is drawn per process by the caller, so nobody can choose
 * ids that all land in one cluster of slots.
 *
 * Every value is compared as a signed 64-bit integer: int32 tokens are widened, never
 * a placeholder id narrowed. The caller passes raw addresses of contiguous CPU tensors
 * it holds for the whole call (mm_schedule/placeholders.py checks them); the GIL stays
 * held, so no other Python thread can resize or free them meanwhile.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>

/* Larger sets would need more than a terabyte of slots; nothing asks for that. */
#define MAX_IDS ((Py_ssize_t)1 << 36)

typedef struct {
    int64_t *ids;
    unsigned char *used;
    size_t mask;
    int shift;
    uint64_t multiplier;
} IdSet;

static inline size_t slot_of(const IdSet *set, int64_t value) {
    return (size_t)(((uint64_t)value * set->multiplier) >> set->shift);
}

static int id_set_build(IdSet *set, const int64_t *ids, Py_ssize_t count, uint64_t multiplier) {
    int bits = 4;
    while (((Py_ssize_t)1 << bits) < 2 * count) {
        bits++;
    }
    size_t capacity = (size_t)1 << bits;
    set->ids = (int64_t *)malloc(capacity * sizeof(int64_t));
    set->used = (unsigned char *)calloc(capacity, 1);
    if (set->ids == NULL || set->used == NULL) {
        free(set->ids);
        free(set->used);
        return -1;
    }
    set->mask = capacity - 1;
    set->shift = 64 - bits;
    set->multiplier = multiplier;
    for (Py_ssize_t i = 0; i < count; i++) {
        int64_t value = ids[i];
        size_t slot = slot_of(set, value);
        while (set->used[slot] && set->ids[slot] != value) {
            slot = (slot + 1) & set->mask;
        }
        set->ids[slot] = value; /* a repeated id lands on its own slot again */
        set->used[slot] = 1;
    }
    return 0;
}

static inline unsigned char id_set_has(const IdSet *set, int64_t value) {
    size_t slot = slot_of(set, value);
    while (set->used[slot]) {
        if (set->ids[slot] == value) {
            return 1;
        }
        slot = (slot + 1) & set->mask;
    }
    return 0;
}

static Py_ssize_t mark_tokens(const IdSet *set, const void *tokens, Py_ssize_t n, int token_bytes,
                              unsigned char *out) {
    Py_ssize_t marked = 0;
    int64_t previous = 0;
    unsigned char previous_mark = id_set_has(set, 0);
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t value = token_bytes == 8 ? ((const int64_t *)tokens)[i] : (int64_t)((const int32_t *)tokens)[i];
        if (value != previous) {
            previous = value;
            previous_mark = id_set_has(set, value);
        }
        out[i] = previous_mark;
        marked += previous_mark;
    }
    return marked;
}

static PyObject *mark_members(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long tokens_address, ids_address, out_address, multiplier;
    Py_ssize_t n_tokens, token_bytes, n_ids;
    if (!PyArg_ParseTuple(args, "KnnKnKK", &tokens_address, &n_tokens, &token_bytes, &ids_address, &n_ids,
                          &out_address, &multiplier)) {
        return NULL;
    }
    if (n_tokens < 0 || n_ids < 1 || n_ids > MAX_IDS || (token_bytes != 4 && token_bytes != 8)) {
        PyErr_Format(PyExc_ValueError,
                     "mark_members: need n_tokens >= 0, 1 <= n_ids <= 2**36 and 4- or 8-byte tokens;"
                     " got n_tokens=%zd, n_ids=%zd, token_bytes=%zd",
                     n_tokens, n_ids, token_bytes);
        return NULL;
    }
    if (ids_address == 0 || (n_tokens > 0 && (tokens_address == 0 || out_address == 0))) {
        PyErr_SetString(PyExc_ValueError, "mark_members: null address");
        return NULL;
    }
    IdSet set;
    if (id_set_build(&set, (const int64_t *)(uintptr_t)ids_address, n_ids, (uint64_t)multiplier | 1u) != 0) {
        return PyErr_NoMemory();
    }
    Py_ssize_t marked = mark_tokens(&set, (const void *)(uintptr_t)tokens_address, n_tokens, (int)token_bytes,
                                    (unsigned char *)(uintptr_t)out_address);
    free(set.ids);
    free(set.used);
    return PyLong_FromSsize_t(marked);
}

static PyMethodDef methods[] = {
    {"mark_members", mark_members, METH_VARARGS,
     "mark_members(tokens_address, n_tokens, token_bytes, ids_address, n_ids, out_address, multiplier) -> int\n\n"
     "out[i] = tokens[i] is one of the n_ids int64 ids (one byte each); returns how many were marked."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_placeholder_set", "Placeholder-token membership in one pass (see placeholders.py).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__placeholder_set(void) {
    return PyModule_Create(&module);
}
