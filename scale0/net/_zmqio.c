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
 *   recv_batch_keyed(handle, limit) -> (list[list[bytes]], list[str])
 *       recv_batch, and for each message its sender's CURVE key: the `User-Id` property of
 *       its first frame (zmq_msg_gets; the key ZAP set for the connection, Z85 from pyzmq's
 *       authenticator), "" when the message has none (no ZAP, not CURVE) or when it is not
 *       UTF-8, as scale0.net.frames_io's fallback reads it. batch_fds() names its connections.
 *   batch_fds() -> list[int]
 *       for each message of the last recv_batch (or _keyed) call, the fd of the connection it
 *       came over (libzmq's ZMQ_SRCFD of its first frame; -1 if libzmq did not say). The broker
 *       tells connections apart by it (R20, docs/protocol.md §8); it costs one int per message.
 *   send_batch(items) -> (sent, [errno, ...])
 *       items: a list of (handle, first_frame, [more frames...]); each is one message, sent
 *       without blocking; the errnos of the messages that could not be sent, in order. The
 *       whole batch is checked first: a bad item or frame raises TypeError naming the message
 *       and frame, and nothing of the batch is sent (see "send_batch" below for why).
 *   heartbeat_items(batch, signature, max_frame_bytes) -> list
 *       recv_batch's messages, each plain HEARTBEAT read into (routing_id, time, config_version,
 *       interval_ms), interval_ms 0 when it has none (scale0/wire/hot.py says what is plain;
 *       its heartbeat_items is the same in Python), so
 *       the broker hands a run of them to the core in one call (docs/performance.md, "Liveness").
 *   hot_items(batch, signature, max_frame_bytes, names) -> list
 *       heartbeat_items, and each plain REQUEST (S0C1) or REPLY (S0W1) read into a 4-tuple of
 *       its fields (scale0/wire/hot.py's hot_items, the same in Python), so the broker hands a
 *       run of them to the core in one call (docs/performance.md, "Runs of REQUESTs and
 *       REPLYs in one call").
 *   Lane(...)
 *       the C lane: a thread that owns the broker's two ROUTERs, answers plain HEARTBEATs and
 *       passes everything else to Python through inproc pipes (scale0/net/_lane.c says how).
 *
 * EINTR is retried, as pyzmq does; Python's signal handlers run when the call returns, never
 * between two frames of a message. Neither call leaves a socket mid-message.
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
#include <locale.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_zmqio.h"

/* The fds of the last recv_batch's (or recv_batch_keyed's) messages (batch_fds), in order. */
static int *fds_buf = NULL;
static Py_ssize_t fds_cap = 0;
static Py_ssize_t fds_len = 0;

/* (declared in _zmqio.h: the lane, scale0/net/_lane.c, calls them too) */
int (*p_msg_init)(s0_zmq_msg_t *);
int (*p_msg_recv)(s0_zmq_msg_t *, void *, int);
int (*p_msg_send)(s0_zmq_msg_t *, void *, int);
void *(*p_msg_data)(s0_zmq_msg_t *);
size_t (*p_msg_size)(const s0_zmq_msg_t *);
int (*p_msg_more)(const s0_zmq_msg_t *);
int (*p_msg_close)(s0_zmq_msg_t *);
int (*p_msg_copy)(s0_zmq_msg_t *, s0_zmq_msg_t *);
int (*p_msg_get)(const s0_zmq_msg_t *, int);
const char *(*p_msg_gets)(const s0_zmq_msg_t *, const char *);
int (*p_send)(void *, const void *, size_t, int);
int (*p_poll)(s0_zmq_pollitem_t *, int, long);
int (*p_errno)(void);
static void (*p_version)(int *, int *, int *);

/* The "C" locale, for reading numbers whatever LC_NUMERIC the process runs under. */
static locale_t c_locale = (locale_t)0;

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
        resolve(lib, "zmq_msg_send", (void **)&p_msg_send) < 0 ||
        resolve(lib, "zmq_poll", (void **)&p_poll) < 0 ||
        resolve(lib, "zmq_msg_data", (void **)&p_msg_data) < 0 ||
        resolve(lib, "zmq_msg_size", (void **)&p_msg_size) < 0 ||
        resolve(lib, "zmq_msg_more", (void **)&p_msg_more) < 0 ||
        resolve(lib, "zmq_msg_close", (void **)&p_msg_close) < 0 ||
        resolve(lib, "zmq_msg_copy", (void **)&p_msg_copy) < 0 ||
        resolve(lib, "zmq_msg_get", (void **)&p_msg_get) < 0 ||
        resolve(lib, "zmq_msg_gets", (void **)&p_msg_gets) < 0 ||
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

/* Receive one frame, retrying EINTR (a signal that arrived during libzmq's poll of its command
 * mailbox; nothing was received). Python's signal handlers are not run here but as soon as the
 * call returns: one could raise, and raising between two frames of a message would lose the
 * frames already read and make the next call return the message's tail as a message of its own.
 * The retry needs a new signal each time, so it ends. Returns 0, or the errno. */
int recv_frame(void *sock, s0_zmq_msg_t *msg) {
    for (;;) {
        if (p_msg_recv(msg, sock, S0_ZMQ_DONTWAIT) >= 0) {
            return 0;
        }
        int err = p_errno();
        if (err != EINTR) {
            return err;
        }
    }
}

/* Send one frame, retrying EINTR as recv_frame does (for the same reasons: nothing was sent,
 * and a handler's exception between two frames would leave the socket mid-message). */
int send_frame(void *sock, const char *buf, size_t len, int flags) {
    for (;;) {
        if (p_send(sock, buf, len, flags) >= 0) {
            return 0;
        }
        int err = p_errno();
        if (err != EINTR) {
            return err;
        }
    }
}

/* ---- recv_batch ---------------------------------------------------------------------------- */

/* Read and drop the frames left of a message whose first frames were read (libzmq delivers a
 * message whole, so they are there; the loop ends at its last frame, or at an error). */
static void discard_rest(void *sock) {
    int more = 1;
    while (more) {
        s0_zmq_msg_t msg;
        p_msg_init(&msg);
        if (recv_frame(sock, &msg) != 0) {
            more = 0;
        } else {
            more = p_msg_more(&msg);
        }
        p_msg_close(&msg);
    }
}

/* The sender's key of a message whose first frame is `msg`: a new reference to a str, "" when
 * the frame has no User-Id or it is not UTF-8 (pyzmq's Frame.get would raise: the fallback
 * reads those as "" too). The last key made is kept, with its bytes: a run of messages from one
 * connection (a client's window of requests) costs a memcmp each, not a new str. NULL:
 * MemoryError. */
#define S0_KEY_CACHE 128
static char key_bytes[S0_KEY_CACHE];
static PyObject *key_last = NULL; /* the str of key_bytes, or NULL */
static PyObject *key_none = NULL; /* "" */

static PyObject *message_key(const s0_zmq_msg_t *msg) {
    const char *uid = p_msg_gets(msg, "User-Id");
    if (uid == NULL) {
        return Py_NewRef(key_none);
    }
    size_t len = strlen(uid);
    if (key_last != NULL && len < S0_KEY_CACHE && memcmp(key_bytes, uid, len + 1) == 0) {
        return Py_NewRef(key_last);
    }
    PyObject *key = PyUnicode_DecodeUTF8(uid, (Py_ssize_t)len, NULL);
    if (key == NULL) {
        if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            return NULL;
        }
        PyErr_Clear();
        return Py_NewRef(key_none);
    }
    if (len < S0_KEY_CACHE) {
        memcpy(key_bytes, uid, len + 1);
        Py_XSETREF(key_last, Py_NewRef(key));
    }
    return key;
}

/* Up to `limit` whole messages into `messages` and, if `keys` is not NULL, each one's sender's
 * key (message_key) into `keys`, in step. Returns 0; or -1 with an exception set and nothing
 * returned: a socket error before the first message (one after it comes back on the next call)
 * or a MemoryError (the batch read so far is lost with it). */
static int receive(void *sock, Py_ssize_t limit, PyObject *messages, PyObject *keys) {
    fds_len = 0;
    while (PyList_GET_SIZE(messages) < limit) {
        PyObject *frames = NULL;
        PyObject *key = NULL;
        int fd = -1;
        int more = 1;
        while (more) {
            s0_zmq_msg_t msg;
            p_msg_init(&msg);
            int err = recv_frame(sock, &msg);
            if (err != 0) {
                p_msg_close(&msg);
                if (err == EAGAIN && frames == NULL) {
                    return 0; /* nothing more waiting: the normal end of a batch */
                }
                Py_XDECREF(frames);
                Py_XDECREF(key);
                if (PyList_GET_SIZE(messages) > 0) {
                    return 0; /* the error comes back on the next call */
                }
                raise_zmq(err);
                return -1;
            }
            PyObject *frame =
                PyBytes_FromStringAndSize((const char *)p_msg_data(&msg), (Py_ssize_t)p_msg_size(&msg));
            more = p_msg_more(&msg);
            int failed = frame == NULL;
            if (frames == NULL) {
                fd = p_msg_get(&msg, S0_ZMQ_SRCFD);
                if (keys != NULL && !failed) {
                    key = message_key(&msg);
                    failed = key == NULL;
                }
                if (!failed) {
                    frames = PyList_New(0);
                    failed = frames == NULL;
                }
            }
            p_msg_close(&msg);
            if (failed || PyList_Append(frames, frame) < 0) {
                Py_XDECREF(frame);
                Py_XDECREF(frames);
                Py_XDECREF(key);
                if (more) {
                    discard_rest(sock); /* else the next call reads its tail as a message */
                }
                return -1; /* MemoryError */
            }
            Py_DECREF(frame);
        }
        if (fds_len == fds_cap) {
            Py_ssize_t cap = fds_cap ? 2 * fds_cap : 512;
            int *grown = PyMem_Realloc(fds_buf, (size_t)cap * sizeof(int));
            if (grown == NULL) {
                Py_DECREF(frames);
                Py_XDECREF(key);
                PyErr_NoMemory(); /* this message is lost, as on any MemoryError */
                return -1;
            }
            fds_buf = grown;
            fds_cap = cap;
        }
        int rc = PyList_Append(messages, frames);
        Py_DECREF(frames);
        if (rc == 0 && keys != NULL) {
            rc = PyList_Append(keys, key);
            if (rc < 0) { /* keep the two lists in step: the message goes too */
                PySequence_DelItem(messages, PyList_GET_SIZE(messages) - 1);
            }
        }
        Py_XDECREF(key);
        if (rc < 0) {
            return -1;
        }
        fds_buf[fds_len++] = fd < 0 ? -1 : fd;
    }
    return 0;
}

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
    if (receive(sock, limit, messages, NULL) < 0) {
        Py_DECREF(messages);
        fds_len = 0;
        return NULL;
    }
    return messages;
}

static PyObject *recv_batch_keyed(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *handle_obj;
    Py_ssize_t limit;
    if (!PyArg_ParseTuple(args, "On:recv_batch_keyed", &handle_obj, &limit)) {
        return NULL;
    }
    void *sock = socket_handle(handle_obj);
    if (sock == NULL) {
        return NULL;
    }
    PyObject *messages = PyList_New(0);
    PyObject *keys = PyList_New(0);
    if (messages == NULL || keys == NULL || receive(sock, limit, messages, keys) < 0) {
        Py_XDECREF(messages);
        Py_XDECREF(keys);
        fds_len = 0;
        return NULL;
    }
    return Py_BuildValue("(NN)", messages, keys);
}

static PyObject *batch_fds(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
    PyObject *fds = PyList_New(fds_len);
    if (fds == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < fds_len; i++) {
        PyObject *fd = PyLong_FromLong(fds_buf[i]);
        if (fd == NULL) {
            Py_DECREF(fds);
            return NULL;
        }
        PyList_SET_ITEM(fds, i, fd);
    }
    return fds;
}

/* ---- send_batch ---------------------------------------------------------------------------- */

/* A batch is checked whole before its first frame is sent: a frame that is not bytes-like,
 * found after earlier frames of its message went out with SNDMORE, would leave the socket
 * mid-message, and the next message sent on it would be spliced onto the broken one (one
 * peer's frames reaching another). So send_batch works in three passes:
 *
 *   1. collect: our own reference to every frame, and each message's socket handle. The items
 *      are read from a tuple copy, and each message's other frames from a list or tuple that
 *      no Python code runs against while we read it (any other sequence is copied first), so
 *      code that runs meanwhile (an iterator, a __buffer__ on 3.12+) cannot free what we use.
 *   2. view: a buffer view on every frame that is not exactly bytes, held until the end.
 *   3. send, without running Python code.
 *
 * A bad item or frame fails pass 1 or 2: nothing of the batch is sent, and a TypeError names
 * the message and the frame (0 is the first frame). */

typedef struct {
    PyObject *obj;    /* our reference, released after the batch is sent */
    const char *buf;  /* the bytes to send: obj's own, or its view's */
    size_t len;
    Py_buffer *view;  /* the view held on a frame that is not bytes, else NULL */
} s0_frame_t;

typedef struct {
    void *sock;
    Py_ssize_t first; /* index of its first frame in the batch's frames */
    Py_ssize_t count;
} s0_message_t;

#define S0_LOCAL_FRAMES 128
#define S0_LOCAL_MESSAGES 32

typedef struct {
    PyObject *items;        /* the tuple copy of the caller's items */
    s0_message_t *messages;
    Py_ssize_t nmessages;
    s0_frame_t *frames;
    Py_ssize_t nframes, frame_cap;
    Py_buffer *views;
    Py_ssize_t nviews;      /* frames that need one */
    Py_ssize_t held_views;  /* views acquired so far */
    s0_frame_t local_frames[S0_LOCAL_FRAMES];
    s0_message_t local_messages[S0_LOCAL_MESSAGES];
} s0_batch_t;

static void batch_release(s0_batch_t *b) {
    for (Py_ssize_t k = 0; k < b->held_views; k++) {
        PyBuffer_Release(&b->views[k]);
    }
    PyMem_Free(b->views);
    for (Py_ssize_t k = 0; k < b->nframes; k++) {
        Py_DECREF(b->frames[k].obj);
    }
    if (b->frames != b->local_frames) {
        PyMem_Free(b->frames);
    }
    if (b->messages != b->local_messages) {
        PyMem_Free(b->messages);
    }
    Py_XDECREF(b->items);
}

/* Replace the pending exception, if it says the item or frame is of the wrong kind, by a
 * TypeError with `text` (a new reference, consumed), the original as its __cause__. Anything
 * else (MemoryError, an exception from a signal handler) is left as it is. */
static void rename_error(PyObject *text) {
    if (text == NULL) {
        return;
    }
    if (!PyErr_ExceptionMatches(PyExc_TypeError) && !PyErr_ExceptionMatches(PyExc_ValueError) &&
        !PyErr_ExceptionMatches(PyExc_BufferError) &&
        !PyErr_ExceptionMatches(PyExc_OverflowError)) {
        Py_DECREF(text);
        return;
    }
#if PY_VERSION_HEX >= 0x030C0000
    PyObject *cause = PyErr_GetRaisedException();
#else
    PyObject *type, *cause, *tb;
    PyErr_Fetch(&type, &cause, &tb);
    PyErr_NormalizeException(&type, &cause, &tb);
    if (tb != NULL) {
        PyException_SetTraceback(cause, tb);
        Py_DECREF(tb);
    }
    Py_DECREF(type);
#endif
    PyObject *exc = PyObject_CallOneArg(PyExc_TypeError, text);
    Py_DECREF(text);
    if (exc == NULL) {
        Py_DECREF(cause);
        return;
    }
    PyException_SetCause(exc, cause); /* steals cause */
    PyErr_SetObject(PyExc_TypeError, exc);
    Py_DECREF(exc);
}

static int push_frame(s0_batch_t *b, PyObject *obj) {
    if (b->nframes == b->frame_cap) {
        Py_ssize_t cap = b->frame_cap * 2;
        s0_frame_t *grown;
        if (b->frames == b->local_frames) {
            grown = PyMem_New(s0_frame_t, cap);
            if (grown != NULL) {
                memcpy(grown, b->local_frames, sizeof(b->local_frames));
            }
        } else {
            grown = PyMem_Resize(b->frames, s0_frame_t, cap);
        }
        if (grown == NULL) {
            PyErr_NoMemory();
            return -1;
        }
        b->frames = grown;
        b->frame_cap = cap;
    }
    s0_frame_t *f = &b->frames[b->nframes++];
    f->obj = Py_NewRef(obj);
    f->view = NULL;
    if (PyBytes_CheckExact(obj)) {
        f->buf = PyBytes_AS_STRING(obj);
        f->len = (size_t)PyBytes_GET_SIZE(obj);
    } else {
        f->buf = NULL;
        f->len = 0;
        b->nviews += 1;
    }
    return 0;
}

static const char bad_item[] =
    "send_batch: message %zd is not a (socket handle, first frame, [other frames]) tuple; "
    "nothing in this batch was sent";

/* Pass 1. */
static int batch_collect(s0_batch_t *b, PyObject *items) {
    b->items = PySequence_Tuple(items);
    if (b->items == NULL) {
        rename_error(PyUnicode_FromString(
            "send_batch takes a sequence of (socket handle, first frame, [other frames]); "
            "nothing was sent"));
        return -1;
    }
    Py_ssize_t count = PyTuple_GET_SIZE(b->items);
    if (count > S0_LOCAL_MESSAGES) {
        b->messages = PyMem_New(s0_message_t, count);
        if (b->messages == NULL) {
            PyErr_NoMemory();
            return -1;
        }
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *entry = PyTuple_GET_ITEM(b->items, i); /* held by b->items */
        if (!PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 3) {
            PyErr_Format(PyExc_TypeError, bad_item, i);
            return -1;
        }
        s0_message_t *m = &b->messages[i];
        m->sock = socket_handle(PyTuple_GET_ITEM(entry, 0));
        if (m->sock == NULL) {
            rename_error(PyUnicode_FromFormat(
                "send_batch: message %zd: the socket handle is not a libzmq socket address; "
                "nothing in this batch was sent",
                i));
            return -1;
        }
        m->first = b->nframes;
        if (push_frame(b, PyTuple_GET_ITEM(entry, 1)) < 0) {
            return -1;
        }
        PyObject *rest = PyTuple_GET_ITEM(entry, 2);
        if (PyList_CheckExact(rest) || PyTuple_CheckExact(rest)) {
            Py_INCREF(rest); /* no Python code runs below: the list cannot change under us */
        } else {
            rest = PySequence_Fast(rest, "");
            if (rest == NULL) {
                rename_error(PyUnicode_FromFormat(
                    "send_batch: message %zd: its other frames are not a sequence; "
                    "nothing in this batch was sent",
                    i));
                return -1;
            }
        }
        for (Py_ssize_t j = 0; j < PySequence_Fast_GET_SIZE(rest); j++) {
            if (push_frame(b, PySequence_Fast_GET_ITEM(rest, j)) < 0) {
                Py_DECREF(rest);
                return -1;
            }
        }
        Py_DECREF(rest);
        m->count = b->nframes - m->first;
        b->nmessages = i + 1;
    }
    return 0;
}

/* Pass 2. */
static int batch_view(s0_batch_t *b) {
    if (b->nviews == 0) {
        return 0;
    }
    b->views = PyMem_New(Py_buffer, b->nviews);
    if (b->views == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    for (Py_ssize_t i = 0; i < b->nmessages; i++) {
        s0_message_t *m = &b->messages[i];
        for (Py_ssize_t j = 0; j < m->count; j++) {
            s0_frame_t *f = &b->frames[m->first + j];
            if (f->buf != NULL) {
                continue;
            }
            Py_buffer *view = &b->views[b->held_views];
            if (PyObject_GetBuffer(f->obj, view, PyBUF_SIMPLE) < 0) {
                rename_error(PyUnicode_FromFormat(
                    "send_batch: message %zd, frame %zd: %.200s is not a contiguous bytes-like "
                    "object; nothing in this batch was sent",
                    i, j, Py_TYPE(f->obj)->tp_name));
                return -1;
            }
            b->held_views += 1;
            f->view = view;
            f->buf = (const char *)view->buf;
            f->len = (size_t)view->len;
        }
    }
    return 0;
}

static PyObject *send_batch(PyObject *self, PyObject *items) {
    (void)self;
    s0_batch_t b;
    b.items = NULL;
    b.messages = b.local_messages;
    b.nmessages = 0;
    b.frames = b.local_frames;
    b.nframes = 0;
    b.frame_cap = S0_LOCAL_FRAMES;
    b.views = NULL;
    b.nviews = 0;
    b.held_views = 0;
    PyObject *errors = NULL;
    if (batch_collect(&b, items) < 0 || batch_view(&b) < 0) {
        goto done;
    }
    errors = PyList_New(0);
    if (errors == NULL) {
        goto done;
    }
    /* Pass 3. A failure on the first frame (EAGAIN at the high-water mark, EHOSTUNREACH for a
     * ROUTER peer that is gone) sends nothing of the message; libzmq accepts the other frames of
     * a message whose first frame it took, so failing later means the socket itself is gone
     * (ETERM, ENOTSOCK). Either way the errno is the message's. */
    Py_ssize_t sent = 0;
    for (Py_ssize_t i = 0; i < b.nmessages; i++) {
        s0_message_t *m = &b.messages[i];
        int err = 0;
        for (Py_ssize_t j = 0; err == 0 && j < m->count; j++) {
            s0_frame_t *f = &b.frames[m->first + j];
            int flags = S0_ZMQ_DONTWAIT | (j + 1 < m->count ? S0_ZMQ_SNDMORE : 0);
            err = send_frame(m->sock, f->buf, f->len, flags);
        }
        if (err == 0) {
            sent += 1;
            continue;
        }
        PyObject *code = PyLong_FromLong(err);
        if (code == NULL || PyList_Append(errors, code) < 0) {
            Py_XDECREF(code);
            Py_CLEAR(errors); /* the batch went out; only its report is lost */
            goto done;
        }
        Py_DECREF(code);
    }
    batch_release(&b);
    return Py_BuildValue("(nN)", sent, errors);
done:
    Py_XDECREF(errors);
    batch_release(&b);
    return NULL;
}

/* ---- heartbeat_items ----------------------------------------------------------------------- */

/* heartbeat_items(batch, signature, max_frame_bytes) -> list, as long as batch: each plain
 * HEARTBEAT (scale0/wire/hot.py heartbeat_fields: exactly [routing id, b"", signature,
 * b"HEARTBEAT", options], the options frame at most max_frame_bytes and exactly
 * {"time":<number with a fraction>,"config_version":<int of at most 18 digits>} in that order,
 * optionally followed by ,"interval_ms":<int 1..999999999 without leading zeros>, JSON
 * whitespace allowed, time finite) becomes the tuple (routing id, time, config_version,
 * interval_ms), interval_ms 0 when absent;
 * every other item is passed through as it is. It reads what recv_batch made; the pure-Python
 * heartbeat_items of scale0/wire/hot.py is the same function (a parity test holds them to it).
 * It never raises for what it cannot read: that item is passed through. */

static const char *skip_ws(const char *p, const char *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r')) {
        p++;
    }
    return p;
}

static const char *expect(const char *p, const char *end, const char *text, size_t len) {
    if ((size_t)(end - p) < len || memcmp(p, text, len) != 0) {
        return NULL;
    }
    return p + len;
}

static int is_digit(char c) { return c >= '0' && c <= '9'; }

/* The options of a plain HEARTBEAT: 1 and *time, *version, *promise (0: no interval_ms) set; 0
 * if not that form (or the time is not finite). Plain C: the lane thread (no GIL) reads its
 * HEARTBEATs with it too. */
int s0_beat_options(const char *p, size_t size, double *time, long long *version,
                    long long *promise) {
    const char *end = p + size;
    if ((p = expect(p, end, "{", 1)) == NULL) return 0; /* (no whitespace before it) */
    p = skip_ws(p, end);
    if ((p = expect(p, end, "\"time\"", 6)) == NULL) return 0;
    p = skip_ws(p, end);
    if ((p = expect(p, end, ":", 1)) == NULL) return 0;
    p = skip_ws(p, end);
    /* (?:0|[1-9][0-9]*)\.[0-9]+(?:[eE][-+]?[0-9]+)? */
    const char *number = p;
    if (p < end && *p == '0') {
        p++;
    } else if (p < end && *p >= '1' && *p <= '9') {
        while (p < end && is_digit(*p)) p++;
    } else {
        return 0;
    }
    if (p >= end || *p != '.') return 0;
    p++;
    if (p >= end || !is_digit(*p)) return 0;
    while (p < end && is_digit(*p)) p++;
    if (p < end && (*p == 'e' || *p == 'E')) {
        const char *q = p + 1;
        if (q < end && (*q == '-' || *q == '+')) q++;
        if (q < end && is_digit(*q)) {
            while (q < end && is_digit(*q)) q++;
            p = q;
        } /* else the "e" is not part of the number, and what follows does not match */
    }
    const char *number_end = p;
    p = skip_ws(p, end);
    if ((p = expect(p, end, ",", 1)) == NULL) return 0;
    p = skip_ws(p, end);
    if ((p = expect(p, end, "\"config_version\"", 16)) == NULL) return 0;
    p = skip_ws(p, end);
    if ((p = expect(p, end, ":", 1)) == NULL) return 0;
    p = skip_ws(p, end);
    long long v = 0;
    if (p < end && *p == '0') {
        p++;
    } else if (p < end && *p >= '1' && *p <= '9') {
        int digits = 0;
        while (p < end && is_digit(*p) && digits < 18) {
            v = v * 10 + (*p - '0');
            p++;
            digits++;
        }
    } else {
        return 0;
    }
    p = skip_ws(p, end); /* a 19th digit is not whitespace or "}": no match, as the regex */
    long long interval = 0;
    if (p < end && *p == ',') {
        /* ,"interval_ms":[1-9][0-9]{0,8} */
        p = skip_ws(p + 1, end);
        if ((p = expect(p, end, "\"interval_ms\"", 13)) == NULL) return 0;
        p = skip_ws(p, end);
        if ((p = expect(p, end, ":", 1)) == NULL) return 0;
        p = skip_ws(p, end);
        if (p >= end || *p < '1' || *p > '9') return 0;
        int digits = 0;
        while (p < end && is_digit(*p) && digits < 9) {
            interval = interval * 10 + (*p - '0');
            p++;
            digits++;
        }
        p = skip_ws(p, end); /* a 10th digit is not whitespace or "}": no match */
    }
    if ((p = expect(p, end, "}", 1)) == NULL) return 0;
    p = skip_ws(p, end);
    if (p != end) return 0;
    /* float() of the matched text: the same correctly rounded conversion. strtod_l reads no
     * further than the match, which is followed by whitespace or "," inside the frame. */
    char *stop = NULL;
    double t = strtod_l(number, &stop, c_locale);
    if (stop != number_end || !isfinite(t)) {
        return 0;
    }
    *time = t;
    *version = v;
    *promise = interval;
    return 1;
}

/* One message of a batch (a list) read as a plain HEARTBEAT in `signature`: 1 and *out the
 * tuple (routing id, time, config_version, interval_ms); 0 and *out NULL if it is not one; -1
 * with an exception (memory). heartbeat_items and hot_items both read HEARTBEATs with it. */
static int beat_item(PyObject *item, const char *signature, Py_ssize_t signature_len,
                     Py_ssize_t max_frame_bytes, PyObject **out) {
    *out = NULL;
    if (PyList_GET_SIZE(item) != 5) {
        return 0;
    }
    PyObject *rid = PyList_GET_ITEM(item, 0);
    PyObject *empty = PyList_GET_ITEM(item, 1);
    PyObject *sig = PyList_GET_ITEM(item, 2);
    PyObject *command = PyList_GET_ITEM(item, 3);
    PyObject *options = PyList_GET_ITEM(item, 4);
    if (!(PyBytes_CheckExact(rid) && PyBytes_CheckExact(empty) && PyBytes_GET_SIZE(empty) == 0 &&
          PyBytes_CheckExact(sig) && PyBytes_GET_SIZE(sig) == signature_len &&
          memcmp(PyBytes_AS_STRING(sig), signature, (size_t)signature_len) == 0 &&
          PyBytes_CheckExact(command) && PyBytes_GET_SIZE(command) == 9 &&
          memcmp(PyBytes_AS_STRING(command), "HEARTBEAT", 9) == 0 &&
          PyBytes_CheckExact(options) && PyBytes_GET_SIZE(options) <= max_frame_bytes)) {
        return 0;
    }
    double time;
    long long version;
    long long promise;
    if (!s0_beat_options(PyBytes_AS_STRING(options), (size_t)PyBytes_GET_SIZE(options), &time,
                         &version, &promise)) {
        return 0;
    }
    *out = Py_BuildValue("(OdLL)", rid, time, version, promise);
    return *out == NULL ? -1 : 1;
}

static PyObject *heartbeat_items(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *batch;
    const char *signature;
    Py_ssize_t signature_len;
    Py_ssize_t max_frame_bytes;
    if (!PyArg_ParseTuple(args, "O!y#n:heartbeat_items", &PyList_Type, &batch, &signature,
                          &signature_len, &max_frame_bytes)) {
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(batch);
    PyObject *items = PyList_New(n);
    if (items == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(batch, i);
        PyObject *out = NULL;
        if (PyList_CheckExact(item) && beat_item(item, signature, signature_len, max_frame_bytes,
                                                 &out) < 0) {
            Py_DECREF(items);
            return NULL;
        }
        if (out == NULL) {
            Py_INCREF(item);
            out = item;
        }
        PyList_SET_ITEM(items, i, out);
    }
    return items;
}

/* ---- hot_items ----------------------------------------------------------------------------- */

/* hot_items(batch, signature, max_frame_bytes, names) -> list, as long as batch: heartbeat_items'
 * HEARTBEATs (4-tuples too, told apart by their float time), and each plain message of the request path read into a 4-tuple: with signature
 * "S0C1" a REQUEST [routing id, b"", S0C1, b"REQUEST", service, request_id, body...] as
 * (routing id, names[service], request_id, (body...)), with "S0W1" a REPLY [routing id, b"",
 * S0W1, b"REPLY", ticket, status, body...] as (routing id, ticket, int(status), (body...)).
 * Plain (scale0/wire/hot.py client_request_fields, worker_reply_fields): every frame bytes of at
 * most max_frame_bytes, frame 4 of 1..255 bytes, a REQUEST's service a key of `names` (the
 * names already checked valid; a new one is passed through and checked by the caller) and its
 * request_id 1..255 bytes, a REPLY's status exactly 3 ASCII digits 100..599. The pure-Python
 * hot_items of scale0/wire/hot.py is the same function (a parity test holds them to it). */

#define S0_MAX_ID_BYTES 255

static int is_bytes_of(PyObject *obj, const char *text, Py_ssize_t len) {
    return PyBytes_CheckExact(obj) && PyBytes_GET_SIZE(obj) == len &&
           memcmp(PyBytes_AS_STRING(obj), text, (size_t)len) == 0;
}

/* The 4-tuple of a plain REQUEST (client) or REPLY, a new reference; NULL without an exception
 * if the message is not that; NULL with one (memory). */
static PyObject *request_path_item(PyObject *item, int client, Py_ssize_t max_frame_bytes,
                                   PyObject *names) {
    Py_ssize_t n = PyList_GET_SIZE(item);
    for (Py_ssize_t k = 0; k < n; k++) {
        PyObject *frame = PyList_GET_ITEM(item, k);
        if (!PyBytes_CheckExact(frame) || PyBytes_GET_SIZE(frame) > max_frame_bytes) {
            return NULL;
        }
    }
    PyObject *empty = PyList_GET_ITEM(item, 1);
    PyObject *id = PyList_GET_ITEM(item, 4);
    if (PyBytes_GET_SIZE(empty) != 0 || PyBytes_GET_SIZE(id) == 0 ||
        PyBytes_GET_SIZE(id) > S0_MAX_ID_BYTES) {
        return NULL;
    }
    PyObject *fifth = PyList_GET_ITEM(item, 5);
    PyObject *second = NULL; /* the service (a new reference) or the request id */
    PyObject *third = NULL;  /* the request id or the status (new reference) */
    if (client) {
        if (PyBytes_GET_SIZE(fifth) == 0 || PyBytes_GET_SIZE(fifth) > S0_MAX_ID_BYTES) {
            return NULL;
        }
        PyObject *service = PyDict_GetItemWithError(names, id); /* borrowed */
        if (service == NULL || !PyUnicode_CheckExact(service)) {
            return NULL; /* (an error from a bytes key's lookup: none is possible) */
        }
        Py_INCREF(service);
        second = service;
        Py_INCREF(fifth);
        third = fifth;
    } else {
        const char *d = PyBytes_AS_STRING(fifth);
        if (PyBytes_GET_SIZE(fifth) != 3 || d[0] < '1' || d[0] > '5' || !is_digit(d[1]) ||
            !is_digit(d[2])) {
            return NULL;
        }
        third = PyLong_FromLong((d[0] - '0') * 100 + (d[1] - '0') * 10 + (d[2] - '0'));
        if (third == NULL) {
            return NULL;
        }
        Py_INCREF(id);
        second = id;
    }
    PyObject *body = PyList_GetSlice(item, 6, n);
    PyObject *tuple = body == NULL ? NULL : PyList_AsTuple(body);
    Py_XDECREF(body);
    if (tuple == NULL) {
        Py_DECREF(second);
        Py_DECREF(third);
        return NULL;
    }
    PyObject *rid = PyList_GET_ITEM(item, 0);
    Py_INCREF(rid);
    PyObject *out = PyTuple_New(4);
    if (out == NULL) {
        Py_DECREF(rid);
        Py_DECREF(second);
        Py_DECREF(third);
        Py_DECREF(tuple);
        return NULL;
    }
    PyTuple_SET_ITEM(out, 0, rid);
    PyTuple_SET_ITEM(out, 1, second);
    PyTuple_SET_ITEM(out, 2, third);
    PyTuple_SET_ITEM(out, 3, tuple);
    return out;
}

static PyObject *hot_items(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *batch;
    const char *signature;
    Py_ssize_t signature_len;
    Py_ssize_t max_frame_bytes;
    PyObject *names;
    if (!PyArg_ParseTuple(args, "O!y#nO!:hot_items", &PyList_Type, &batch, &signature,
                          &signature_len, &max_frame_bytes, &PyDict_Type, &names)) {
        return NULL;
    }
    int client = signature_len == 4 && memcmp(signature, "S0C1", 4) == 0;
    const char *command = client ? "REQUEST" : "REPLY";
    Py_ssize_t command_len = client ? 7 : 5;
    Py_ssize_t n = PyList_GET_SIZE(batch);
    PyObject *items = PyList_New(n);
    if (items == NULL) {
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PyList_GET_ITEM(batch, i);
        PyObject *out = NULL;
        if (PyList_CheckExact(item) && PyList_GET_SIZE(item) >= 6 &&
            is_bytes_of(PyList_GET_ITEM(item, 3), command, command_len) &&
            is_bytes_of(PyList_GET_ITEM(item, 2), signature, signature_len)) {
            out = request_path_item(item, client, max_frame_bytes, names);
            if (out == NULL && PyErr_Occurred()) {
                Py_DECREF(items);
                return NULL;
            }
        } else if (PyList_CheckExact(item) &&
                   beat_item(item, signature, signature_len, max_frame_bytes, &out) < 0) {
            Py_DECREF(items);
            return NULL;
        }
        if (out == NULL) {
            Py_INCREF(item);
            out = item;
        }
        PyList_SET_ITEM(items, i, out);
    }
    return items;
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
    {"recv_batch_keyed", recv_batch_keyed, METH_VARARGS,
     "recv_batch_keyed(handle, limit) -> (messages, [sender's CURVE key (User-Id) or '', ...])"},
    {"batch_fds", batch_fds, METH_NOARGS,
     "batch_fds() -> the connection fd of each message of the last recv_batch or\n"
     "recv_batch_keyed (-1: unknown)"},
    {"send_batch", send_batch, METH_O,
     "send_batch([(handle, first, rest), ...]) -> (sent, [errno of each failed message])"},
    {"heartbeat_items", heartbeat_items, METH_VARARGS,
     "heartbeat_items(batch, signature, max_frame_bytes) -> batch, each plain HEARTBEAT as "
     "(routing_id, time, config_version, interval_ms)"},
    {"hot_items", hot_items, METH_VARARGS,
     "hot_items(batch, signature, max_frame_bytes, names) -> batch, each plain HEARTBEAT as in "
     "heartbeat_items, each plain REQUEST (S0C1) or REPLY (S0W1) as a 4-tuple of its fields"},
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
    if (c_locale == (locale_t)0) {
        c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
        if (c_locale == (locale_t)0) {
            PyErr_SetString(PyExc_ImportError, "cannot make the C locale (newlocale)");
            return NULL;
        }
    }
    if (key_none == NULL) {
        key_none = PyUnicode_FromString("");
        if (key_none == NULL) {
            return NULL;
        }
    }
    PyObject *m = PyModule_Create(&module);
    if (m != NULL && s0_lane_add(m) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
