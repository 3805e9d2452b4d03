/* Rows copied into a CPU destination as plain bytes, for the scheduler's host path:
 *
 * - append_rows: whole tensors one after another (a packed step result);
 * - copy_ranges: byte ranges at given offsets (rows scattered into input_embeds).
 *
 * One call copies a whole step, so no Python runs per segment. A destination of many
 * megabytes cannot stay in the CPU caches, and an ordinary copy pays twice for every
 * destination line: it first reads the old line into the cache (to own it), then
 * writes it back later. Streaming (non-temporal) stores write whole lines straight to
 * memory and skip that read, about a third of the copy's memory traffic; they only pay
 * for destinations too large to be read back from the cache anyway, which the caller
 * (host_copy.py) decides. Without SSE2 they are plain memcpy calls.
 *
 * append_rows asks each tensor for its address and nothing else: the caller vouches
 * that every tensor is a contiguous CPU tensor of the destination's dtype and row
 * length, without a negated view, holding the given number of rows (the scheduler's
 * validated sources are); the total is checked against the destination. copy_ranges
 * checks every range against the destination and the source span. Both check before
 * the first byte moves, and hold the GIL, so no other Python thread can resize or free
 * a tensor meanwhile.
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#if defined(__SSE2__) || defined(_M_X64)
#include <emmintrin.h>
#define HAVE_STREAMING_STORES 1
#else
#define HAVE_STREAMING_STORES 0
#endif

static PyObject *data_ptr_name; /* interned "data_ptr" */

static void copy_streaming(char *dst, const char *src, size_t n) {
#if HAVE_STREAMING_STORES
    size_t head = (16 - ((uintptr_t)dst & 15)) & 15; /* streaming stores need 16-byte aligned targets */
    if (head > n) {
        head = n;
    }
    memcpy(dst, src, head);
    size_t i = head;
    for (; i + 64 <= n; i += 64) {
        __m128i a = _mm_loadu_si128((const __m128i *)(src + i));
        __m128i b = _mm_loadu_si128((const __m128i *)(src + i + 16));
        __m128i c = _mm_loadu_si128((const __m128i *)(src + i + 32));
        __m128i d = _mm_loadu_si128((const __m128i *)(src + i + 48));
        _mm_stream_si128((__m128i *)(dst + i), a);
        _mm_stream_si128((__m128i *)(dst + i + 16), b);
        _mm_stream_si128((__m128i *)(dst + i + 32), c);
        _mm_stream_si128((__m128i *)(dst + i + 48), d);
    }
    memcpy(dst + i, src + i, n - i);
#else
    memcpy(dst, src, n);
#endif
}

static PyObject *append_rows(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long dst_address, dst_bytes, row_bytes;
    PyObject *tensors, *rows;
    if (!PyArg_ParseTuple(args, "KKO!O!K", &dst_address, &dst_bytes, &PyList_Type, &tensors, &PyList_Type, &rows,
                          &row_bytes)) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(tensors);
    if (PyList_GET_SIZE(rows) != n) {
        PyErr_Format(PyExc_ValueError, "append_rows: %zd tensors but %zd row counts", n, PyList_GET_SIZE(rows));
        return NULL;
    }
    size_t *sizes = (size_t *)malloc((size_t)(n > 0 ? n : 1) * 2 * sizeof(size_t));
    if (sizes == NULL) {
        return PyErr_NoMemory();
    }
    size_t *from = sizes + n;
    PyObject *result = NULL;
    unsigned long long total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned long long count = PyLong_AsUnsignedLongLong(PyList_GET_ITEM(rows, i));
        if (count == (unsigned long long)-1 && PyErr_Occurred()) {
            goto done;
        }
        if (row_bytes && count > (dst_bytes - total) / row_bytes) {
            PyErr_Format(PyExc_ValueError, "append_rows: the tensors hold more than the destination's %llu bytes",
                         dst_bytes);
            goto done;
        }
        sizes[i] = (size_t)(count * row_bytes);
        total += count * row_bytes;
        PyObject *address = PyObject_CallMethodNoArgs(PyList_GET_ITEM(tensors, i), data_ptr_name);
        if (address == NULL) {
            goto done;
        }
        from[i] = (size_t)PyLong_AsUnsignedLongLong(address);
        Py_DECREF(address);
        if (PyErr_Occurred()) {
            goto done;
        }
        if (sizes[i] && from[i] == 0) {
            PyErr_SetString(PyExc_ValueError, "append_rows: a tensor with rows has no data");
            goto done;
        }
    }
    if (total != dst_bytes || (total && dst_address == 0)) {
        PyErr_Format(PyExc_ValueError, "append_rows: the tensors hold %llu bytes, the destination %llu", total,
                     dst_bytes);
        goto done;
    }
    char *dst = (char *)(uintptr_t)dst_address;
    for (Py_ssize_t i = 0; i < n; i++) {
        copy_streaming(dst, (const char *)from[i], sizes[i]);
        dst += sizes[i];
    }
#if HAVE_STREAMING_STORES
    _mm_sfence(); /* every store is visible to any reader before the call returns */
#endif
    result = PyLong_FromUnsignedLongLong(total);
done:
    free(sizes);
    return result;
}

/* Reads a list of n ints; -1 with an exception set on failure. */
static int read_column(PyObject *list, const char *what, Py_ssize_t n, long long *out) {
    if (!PyList_Check(list) || PyList_GET_SIZE(list) != n) {
        PyErr_Format(PyExc_ValueError, "copy_ranges: %s must be a list of %zd ints", what, n);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        out[i] = PyLong_AsLongLong(PyList_GET_ITEM(list, i));
        if (out[i] == -1 && PyErr_Occurred()) {
            return -1;
        }
    }
    return 0;
}

/* True when [start, start + count) lies inside [0, size). */
static int inside(long long start, long long count, unsigned long long size) {
    return start >= 0 && (unsigned long long)start <= size && (unsigned long long)count <= size - start;
}

static PyObject *copy_ranges(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long dst_address, dst_bytes, src_address, src_bytes;
    PyObject *write_from, *read_from, *lengths;
    int streaming;
    if (!PyArg_ParseTuple(args, "KKKKO!O!O!p", &dst_address, &dst_bytes, &src_address, &src_bytes, &PyList_Type,
                          &write_from, &PyList_Type, &read_from, &PyList_Type, &lengths, &streaming)) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(lengths);
    long long *columns = (long long *)malloc((size_t)(n > 0 ? n : 1) * 3 * sizeof(long long));
    if (columns == NULL) {
        return PyErr_NoMemory();
    }
    long long *to = columns, *from = columns + n, *count = columns + 2 * n;
    PyObject *result = NULL;
    if (read_column(write_from, "write_from", n, to) != 0 || read_column(read_from, "read_from", n, from) != 0 ||
        read_column(lengths, "lengths", n, count) != 0) {
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) { /* every range checked before the first byte moves */
        if (count[i] < 0) {
            PyErr_Format(PyExc_ValueError, "copy_ranges: range %zd has a negative length", i);
            goto done;
        }
        if (count[i] == 0) {
            continue; /* an empty range reads and writes nothing, wherever it points */
        }
        if (!inside(to[i], count[i], dst_bytes)) {
            PyErr_Format(PyExc_ValueError, "copy_ranges: range %zd lies outside the destination's %llu bytes", i,
                         dst_bytes);
            goto done;
        }
        if (!inside(from[i], count[i], src_bytes)) {
            PyErr_Format(PyExc_ValueError, "copy_ranges: range %zd reads outside the sources' %llu bytes", i,
                         src_bytes);
            goto done;
        }
        if (dst_address == 0 || src_address == 0) {
            PyErr_SetString(PyExc_ValueError, "copy_ranges: null address");
            goto done;
        }
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (count[i] == 0) {
            continue;
        }
        char *dst = (char *)(uintptr_t)(dst_address + (unsigned long long)to[i]);
        const char *src = (const char *)(uintptr_t)(src_address + (unsigned long long)from[i]);
        if (streaming) {
            copy_streaming(dst, src, (size_t)count[i]);
        } else {
            memcpy(dst, src, (size_t)count[i]);
        }
    }
#if HAVE_STREAMING_STORES
    if (streaming) {
        _mm_sfence();
    }
#endif
    result = Py_NewRef(Py_None);
done:
    free(columns);
    return result;
}

/* pack_table(address, capacity_words, segments, sources, block_m_for) -> (words, aligned, rows, tiles)
 *
 * The segment table of table.py written straight into a host buffer of capacity_words
 * int64 words at address: [n_segments, the cumulative tile count of each segment, the
 * segments' four fields each, every source's data_ptr()]. One pass over the segments
 * reads their fields and counts the rows they copy; block_m_for(rows) then names the
 * tile height the launch uses for that many rows, and the tile counts are summed from
 * the row counts just written (C memory, no Python object touched again). A step of
 * many images calls data_ptr() on each source, which costs less from C than through
 * Python's call machinery. Nothing is written unless it fits. */
static PyObject *pack_table(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long address;
    Py_ssize_t capacity;
    PyObject *segments, *sources, *block_m_for;
    if (!PyArg_ParseTuple(args, "KnOOO", &address, &capacity, &segments, &sources, &block_m_for)) {
        return NULL;
    }
    PyObject *segs = PySequence_Fast(segments, "segments must be a sequence");
    if (segs == NULL) {
        return NULL;
    }
    PyObject *srcs = PySequence_Fast(sources, "sources must be a sequence");
    if (srcs == NULL) {
        Py_DECREF(segs);
        return NULL;
    }
    Py_ssize_t n_segs = PySequence_Fast_GET_SIZE(segs), n_srcs = PySequence_Fast_GET_SIZE(srcs);
    Py_ssize_t words = 1 + 5 * n_segs + n_srcs;
    int64_t *out = (int64_t *)(uintptr_t)address;
    int64_t *ends = out + 1, *records = out + 1 + n_segs, *addresses = out + 1 + 5 * n_segs;
    long long rows = 0, tiles = 0, block_m;
    int aligned = 1;
    if (words > capacity) {
        PyErr_Format(PyExc_ValueError, "the table needs %zd words, the buffer holds %zd", words, capacity);
        goto fail;
    }
    out[0] = n_segs;
    for (Py_ssize_t i = 0; i < n_segs; i++) {
        PyObject *seg = PySequence_Fast(PySequence_Fast_GET_ITEM(segs, i), "a segment must be a sequence");
        if (seg == NULL) {
            goto fail;
        }
        if (PySequence_Fast_GET_SIZE(seg) != 4) {
            Py_DECREF(seg);
            PyErr_Format(PyExc_ValueError, "segment %zd must have 4 fields", i);
            goto fail;
        }
        for (int k = 0; k < 4; k++) {
            long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(seg, k));
            if (v == -1 && PyErr_Occurred()) {
                Py_DECREF(seg);
                goto fail;
            }
            records[4 * i + k] = v;
        }
        Py_DECREF(seg);
        if (records[4 * i + 2] > 0) { /* a segment of no rows has no tiles, and copies nothing */
            rows += records[4 * i + 2];
        }
    }
    PyObject *chosen = PyObject_CallFunction(block_m_for, "L", rows);
    if (chosen == NULL) {
        goto fail;
    }
    block_m = PyLong_AsLongLong(chosen);
    Py_DECREF(chosen);
    if (block_m == -1 && PyErr_Occurred()) {
        goto fail;
    }
    if (block_m <= 0) {
        PyErr_Format(PyExc_ValueError, "block_m_for(%lld) returned %lld; a tile holds at least one row", rows, block_m);
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n_segs; i++) {
        if (records[4 * i + 2] > 0) {
            tiles += (records[4 * i + 2] + block_m - 1) / block_m;
        }
        ends[i] = tiles;
    }
    for (Py_ssize_t j = 0; j < n_srcs; j++) {
        PyObject *value = PyObject_CallMethodNoArgs(PySequence_Fast_GET_ITEM(srcs, j), data_ptr_name);
        if (value == NULL) {
            goto fail;
        }
        unsigned long long a = PyLong_AsUnsignedLongLong(value);
        Py_DECREF(value);
        if (a == (unsigned long long)-1 && PyErr_Occurred()) {
            goto fail;
        }
        aligned &= (a & 15) == 0;
        addresses[j] = (int64_t)a;
    }
    Py_DECREF(segs);
    Py_DECREF(srcs);
    return Py_BuildValue("nOLL", words, aligned ? Py_True : Py_False, rows, tiles);
fail:
    Py_DECREF(segs);
    Py_DECREF(srcs);
    return NULL;
}

/* pack_whole(address, capacity_words, rows, addresses, block_m) -> (words, aligned, rows, tiles)
 *
 * pack_table's table for the packed layout of whole sources in order (segment i is all of
 * source i, its rows right after segment i - 1's), from two lists of exact ints: each
 * source's row count and the address of its first row, for tiles of block_m rows. Reads no
 * tensor: a step whose sources are all cache hits has their addresses from the cache, so a
 * thousand images cost a pass over two lists instead of a call on each tensor. Nothing is
 * written unless it fits. */
static PyObject *pack_whole(PyObject *self, PyObject *args) {
    (void)self;
    unsigned long long address;
    Py_ssize_t capacity;
    long long block_m;
    PyObject *rows_list, *addresses_list;
    if (!PyArg_ParseTuple(args, "KnO!O!L", &address, &capacity, &PyList_Type, &rows_list, &PyList_Type,
                          &addresses_list, &block_m)) {
        return NULL;
    }
    if (block_m <= 0) {
        PyErr_Format(PyExc_ValueError, "pack_whole: a tile holds at least one row, got block_m=%lld", block_m);
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(rows_list);
    if (PyList_GET_SIZE(addresses_list) != n) {
        PyErr_Format(PyExc_ValueError, "pack_whole: %zd row counts for %zd addresses", n,
                     PyList_GET_SIZE(addresses_list));
        return NULL;
    }
    Py_ssize_t words = 1 + 5 * n + n;
    if (words > capacity) {
        PyErr_Format(PyExc_ValueError, "the table needs %zd words, the buffer holds %zd", words, capacity);
        return NULL;
    }
    int64_t *out = (int64_t *)(uintptr_t)address;
    int64_t *ends = out + 1, *records = out + 1 + n, *addresses = out + 1 + 5 * n;
    long long total = 0, tiles = 0;
    int aligned = 1;
    out[0] = n;
    for (Py_ssize_t i = 0; i < n; i++) {
        /* The lists are the caller's: read again at every index (no Python code runs here). */
        if (i >= PyList_GET_SIZE(rows_list) || i >= PyList_GET_SIZE(addresses_list)) {
            PyErr_SetString(PyExc_ValueError, "pack_whole: the lists changed while being read");
            return NULL;
        }
        PyObject *r = PyList_GET_ITEM(rows_list, i), *a = PyList_GET_ITEM(addresses_list, i);
        if (!PyLong_CheckExact(r) || !PyLong_CheckExact(a)) {
            PyErr_Format(PyExc_TypeError, "pack_whole: row count and address %zd must be ints", i);
            return NULL;
        }
        long long n_rows = PyLong_AsLongLong(r);
        unsigned long long at = PyLong_AsUnsignedLongLong(a);
        if ((n_rows == -1 || at == (unsigned long long)-1) && PyErr_Occurred()) {
            return NULL;
        }
        if (n_rows < 0) {
            PyErr_Format(PyExc_ValueError, "pack_whole: source %zd has %lld rows", i, n_rows);
            return NULL;
        }
        records[4 * i] = i;
        records[4 * i + 1] = 0;
        records[4 * i + 2] = n_rows;
        records[4 * i + 3] = total;
        total += n_rows;
        tiles += (n_rows + block_m - 1) / block_m;
        ends[i] = tiles;
        aligned &= (at & 15) == 0;
        addresses[i] = (int64_t)at;
    }
    return Py_BuildValue("nOLL", words, aligned ? Py_True : Py_False, total, tiles);
}

static PyMethodDef methods[] = {
    {"append_rows", append_rows, METH_VARARGS,
     "append_rows(dst_address, dst_bytes, tensors, rows, row_bytes) -> int\n\n"
     "Copy every tensor's rows[i] * row_bytes bytes, one after another, to dst_address with\n"
     "streaming stores; the total must be dst_bytes. Returns the bytes written."},
    {"pack_table", pack_table, METH_VARARGS,
     "pack_table(address, capacity_words, segments, sources, block_m_for) -> (words, aligned, rows, tiles)\n\n"
     "Write the segment table (header, cumulative tile counts for tiles of block_m_for(rows) rows,\n"
     "segments, source addresses) as int64 words at address."},
    {"pack_whole", pack_whole, METH_VARARGS,
     "pack_whole(address, capacity_words, rows, addresses, block_m) -> (words, aligned, rows, tiles)\n\n"
     "pack_table's table for whole sources in order, from their row counts and first-row addresses\n"
     "(lists of ints), for tiles of block_m rows: no tensor is read."},
    {"copy_ranges", copy_ranges, METH_VARARGS,
     "copy_ranges(dst_address, dst_bytes, src_address, src_bytes, write_from, read_from, lengths, streaming)\n\n"
     "Copy lengths[i] bytes from src_address + read_from[i] to dst_address + write_from[i] for\n"
     "every i; every range must lie inside [0, dst_bytes) and [0, src_bytes)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_stream_copy", "Large CPU copies with streaming stores (see host_copy.py).", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__stream_copy(void) {
    data_ptr_name = PyUnicode_InternFromString("data_ptr");
    if (data_ptr_name == NULL) {
        return NULL;
    }
    return PyModule_Create(&module);
}
