/*
 * scale0.net._zmqio: whole-message receive and batched send for the broker's hot path.
 *
 * pyzmq's Python-level calls cost about a microsecond per frame, and a broker hop moves 12-14
 * frames per request (docs/performance.md). This module does the same libzmq calls pyzmq makes
 * (zmq_msg_recv / zmq_send with ZMQ_DONTWAIT), in C, for a whole batch of messages per call:
 *
 *   recv_batch(handle, limit) -> list[list[bytes]]
 *       up to `limit` whole messages waiting on the socket, [] when none is; stops at EAGAIN,
 *       which also lets libzmq process the socket's pending commands (so an edge-triggered
 *       ZMQ_FD is safe to sleep on afterwards).
 *   send_batch(items) -> (sent, [errno, ...])
 *       items: a list of (handle, first_frame, [more frames...]); each is one message, sent
 *       without blocking; the errnos of the messages that could not be sent, in order.
 *
 * `handle` is pyzmq's Socket.underlying (the libzmq socket pointer). The caller must not pass a
 * closed socket: libzmq has no way to tell, and neither does this module.
 *
 * No zmq.h is needed at build time: the few functions used are looked up at import in the one
 * libzmq that pyzmq has already loaded into the process (dl_iterate_phdr + dlopen with
 * RTLD_NOLOAD), so this module always talks to the same library, and the same sockets, as
 * pyzmq. zmq_msg_t is libzmq's documented 64-byte opaque struct (stable ABI since 4.0).
 * Import fails (and scale0.net.frames_io falls back to pyzmq) if libzmq is not loaded, or is
 * loaded twice.
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <link.h>
#include <stdint.h>
#include <string.h>

#define S0_ZMQ_DONTWAIT 1
#define S0_ZMQ_SNDMORE 2

typedef struct {
    unsigned char _[64];
} __attribute__((aligned(sizeof(void *)))) s0_zmq_msg_t;

static int (*p_msg_init)(s0_zmq_msg_t *);
static int (*p_msg_recv)(s0_zmq_msg_t *, void *, int);
static void *(*p_msg_data)(s0_zmq_msg_t *);
static size_t (*p_msg_size)(const s0_zmq_msg_t *);
static int (*p_msg_more)(const s0_zmq_msg_t *);
static int (*p_msg_close)(s0_zmq_msg_t *);
static int (*p_send)(void *, const void *, size_t, int);
static int (*p_errno)(void);
static void (*p_version)(int *, int *, int *);

/* The error class to raise (zmq.ZMQError, given to setup()), called with the errno. */
static PyObject *error_class = NULL;

/* ---- finding libzmq ------------------------------------------------------------------------ */

typedef struct {
    char path[4096];
    int count;
} found_t;

static int find_libzmq(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    found_t *found = (found_t *)data;
    const char *name = info->dlpi_name;
    if (name == NULL || name[0] == '\0') {
        return 0;
    }
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (strncmp(base, "libzmq", 6) == 0) {
        found->count += 1;
        strncpy(found->path, name, sizeof(found->path) - 1);
        found->path[sizeof(found->path) - 1] = '\0';
    }
    return 0;
}

static int resolve(void *lib, const char *name, void **slot) {
    *slot = dlsym(lib, name);
    if (*slot == NULL) {
        PyErr_Format(PyExc_ImportError, "libzmq has no symbol %s", name);
        return -1;
    }
    return 0;
}

static int load_libzmq(void) {
    found_t found;
    memset(&found, 0, sizeof(found));
    dl_iterate_phdr(find_libzmq, &found);
    if (found.count != 1) {
        PyErr_Format(PyExc_ImportError,
                     "expected exactly one libzmq loaded by pyzmq (import zmq first), found %d",
                     found.count);
        return -1;
    }
    void *lib = dlopen(found.path, RTLD_NOW | RTLD_NOLOAD);
    if (lib == NULL) {
        PyErr_Format(PyExc_ImportError, "cannot reopen %s: %s", found.path, dlerror());
        return -1;
    }
    if (resolve(lib, "zmq_msg_init", (void **)&p_msg_init) < 0 ||
        resolve(lib, "zmq_msg_recv", (void **)&p_msg_recv) < 0 ||
        resolve(lib, "zmq_msg_data", (void **)&p_msg_data) < 0 ||
        resolve(lib, "zmq_msg_size", (void **)&p_msg_size) < 0 ||
        resolve(lib, "zmq_msg_more", (void **)&p_msg_more) < 0 ||
        resolve(lib, "zmq_msg_close", (void **)&p_msg_close) < 0 ||
        resolve(lib, "zmq_send", (void **)&p_send) < 0 ||
        resolve(lib, "zmq_errno", (void **)&p_errno) < 0 ||
        resolve(lib, "zmq_version", (void **)&p_version) < 0) {
        return -1;
    }
    int major = 0, minor = 0, patch = 0;
    p_version(&major, &minor, &patch);
    if (major != 4) { /* zmq_msg_t's size and the calls above are libzmq 4's */
        PyErr_Format(PyExc_ImportError, "libzmq %d.%d.%d is not libzmq 4", major, minor, patch);
        return -1;
    }
    return 0;
}

/* ---- helpers ------------------------------------------------------------------------------- */

static void *socket_handle(PyObject *obj) {
    void *handle = PyLong_AsVoidPtr(obj);
    if (handle == NULL && !PyErr_Occurred()) {
        PyErr_SetString(PyExc_ValueError, "socket handle is NULL");
    }
    return handle;
}

static PyObject *raise_zmq(int err) {
    if (error_class == NULL) {
        errno = err;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    PyObject *exc = PyObject_CallFunction(error_class, "i", err);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* Send one frame from any bytes-like object. Returns 0, or the errno. */
static int send_frame(void *sock, PyObject *frame, int flags, int *failed_in_python) {
    if (PyBytes_CheckExact(frame)) {
        if (p_send(sock, PyBytes_AS_STRING(frame), (size_t)PyBytes_GET_SIZE(frame), flags) < 0) {
            return p_errno();
        }
        return 0;
    }
    Py_buffer view;
    if (PyObject_GetBuffer(frame, &view, PyBUF_SIMPLE) < 0) {
        *failed_in_python = 1;
        return EINVAL;
    }
    int rc = p_send(sock, view.buf, (size_t)view.len, flags);
    int err = rc < 0 ? p_errno() : 0;
    PyBuffer_Release(&view);
    return err;
}

/* ---- recv_batch ---------------------------------------------------------------------------- */

static PyObject *recv_batch(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *handle_obj;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "On:recv_batch", &handle_obj, &limit)) {
        return NULL;
    }
    void *sock = socket_handle(handle_obj);
    if (sock == NULL) {
        return NULL;
    }
    PyObject *messages = PyList_New(0);
    if (messages == NULL) {
        return NULL;
    }
    while (PyList_GET_SIZE(messages) < limit) {
        PyObject *frames = NULL;
        int more = 1;
        while (more) {
            s0_zmq_msg_t msg;
            p_msg_init(&msg);
            if (p_msg_recv(&msg, sock, S0_ZMQ_DONTWAIT) < 0) {
                int err = p_errno();
                p_msg_close(&msg);
                if (err == EAGAIN && frames == NULL) {
                    return messages; /* nothing more waiting: the normal end of a batch */
                }
                Py_XDECREF(frames);
                if (PyList_GET_SIZE(messages) > 0) {
                    return messages; /* the error comes back on the next call */
                }
                Py_DECREF(messages);
                return raise_zmq(err);
            }
            PyObject *frame =
                PyBytes_FromStringAndSize((const char *)p_msg_data(&msg), (Py_ssize_t)p_msg_size(&msg));
            more = p_msg_more(&msg);
            p_msg_close(&msg);
            if (frame == NULL) {
                Py_XDECREF(frames);
                Py_DECREF(messages);
                return NULL;
            }
            if (frames == NULL) {
                frames = PyList_New(0);
                if (frames == NULL) {
                    Py_DECREF(frame);
                    Py_DECREF(messages);
                    return NULL;
                }
            }
            int rc = PyList_Append(frames, frame);
            Py_DECREF(frame);
            if (rc < 0) {
                Py_DECREF(frames);
                Py_DECREF(messages);
                return NULL;
            }
        }
        int rc = PyList_Append(messages, frames);
        Py_DECREF(frames);
        if (rc < 0) {
            Py_DECREF(messages);
            return NULL;
        }
    }
    return messages;
}

/* ---- send_batch ---------------------------------------------------------------------------- */

static PyObject *send_batch(PyObject *self, PyObject *items) {
    (void)self;
    PyObject *seq = PySequence_Fast(items, "send_batch takes a list of (handle, first, rest)");
    if (seq == NULL) {
        return NULL;
    }
    PyObject *errors = PyList_New(0);
    if (errors == NULL) {
        Py_DECREF(seq);
        return NULL;
    }
    Py_ssize_t sent = 0;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject **entries = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *entry = entries[i];
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 3) {
            PyErr_SetString(PyExc_TypeError, "send_batch: each item is (handle, first, rest)");
            goto fail;
        }
        void *sock = socket_handle(PyTuple_GET_ITEM(entry, 0));
        if (sock == NULL) {
            goto fail;
        }
        PyObject *rest = PySequence_Fast(PyTuple_GET_ITEM(entry, 2), "rest is a list of frames");
        if (rest == NULL) {
            goto fail;
        }
        Py_ssize_t nrest = PySequence_Fast_GET_SIZE(rest);
        PyObject **frames = PySequence_Fast_ITEMS(rest);
        int in_python = 0;
        int err = send_frame(sock, PyTuple_GET_ITEM(entry, 1),
                             S0_ZMQ_DONTWAIT | (nrest ? S0_ZMQ_SNDMORE : 0), &in_python);
        for (Py_ssize_t j = 0; err == 0 && j < nrest; j++) {
            int flags = S0_ZMQ_DONTWAIT | (j + 1 < nrest ? S0_ZMQ_SNDMORE : 0);
            err = send_frame(sock, frames[j], flags, &in_python);
        }
        Py_DECREF(rest);
        if (in_python) {
            goto fail; /* a frame that is not bytes-like: a caller's bug, raised as such */
        }
        if (err == 0) {
            sent += 1;
            continue;
        }
        PyObject *code = PyLong_FromLong(err);
        if (code == NULL || PyList_Append(errors, code) < 0) {
            Py_XDECREF(code);
            goto fail;
        }
        Py_DECREF(code);
    }
    Py_DECREF(seq);
    return Py_BuildValue("(nN)", sent, errors);
fail:
    Py_DECREF(errors);
    Py_DECREF(seq);
    return NULL;
}

/* ---- setup --------------------------------------------------------------------------------- */

static PyObject *setup(PyObject *self, PyObject *cls) {
    (void)self;
    Py_XINCREF(cls);
    Py_XSETREF(error_class, cls);
    Py_RETURN_NONE;
}

static PyMethodDef methods[] = {
    {"recv_batch", recv_batch, METH_VARARGS,
     "recv_batch(handle, limit) -> list of messages (lists of bytes), up to limit, [] if none"},
    {"send_batch", send_batch, METH_O,
     "send_batch([(handle, first, rest), ...]) -> (sent, [errno of each failed message])"},
    {"setup", setup, METH_O, "setup(error_class): the exception raised, called with an errno"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "scale0.net._zmqio",
    .m_doc = "Whole-message receive and batched send on pyzmq's libzmq (see the C source's header).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__zmqio(void) {
    if (load_libzmq() < 0) {
        return NULL;
    }
    return PyModule_Create(&module);
}
