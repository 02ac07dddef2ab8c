/*
 * scale0.net._zmqio.Lane: a C thread that owns the broker's frontend and backend ROUTER sockets
 * and takes plain HEARTBEATs, S0P and Majordomo workers', without waking Python (phase 3a of
 * the C lane, docs/architecture.md
 * "Decided, being built: the data plane moves to a C lane"; issue 14), and dispatches
 * Majordomo client REQUESTs to Majordomo workers and S0P client REQUESTs to S0P workers (or
 * queues them, behind Python's queue) and returns their final REPLYs (an S0P one into the
 * lane's reply cache too), sharing the worker pool (scale0/core/_pool.c) with the Python core
 * under one lock (phase 3b: "Requests", "S0P requests", "R10's keys" and "The reply cache"
 * below; the rule's Python twin is RequestLane in tests/core/test_lane_requests.py). Given the
 * peer ROUTER too, it runs the simplest FORWARDs of peer brokers on its S0P workers and answers
 * their FORWARDREPLYs (phase 4a: "Forwards" below). Given the link pipe too, it holds this
 * broker's link DEALERs to its peers, forwards an S0P client's REQUEST no local worker is ready
 * for to the peer with the most free slots and answers the client from that peer's
 * FORWARDREPLY (phase 4b: "Links" and "Forwarding out" below).
 *
 *   Lane(frontend, backend, front_pipe, back_pipe, keyed_front, keyed_back, max_frame_bytes,
 *        peer=None, peer_pipe=None, keyed_peer=False, link_pipe=None)
 *       handles: pyzmq Socket.underlying ints. front_pipe/back_pipe: the lane's ends of two
 *       inproc PAIR pipes whose other ends Python keeps. peer and peer_pipe: both given (the
 *       peer ROUTER and the lane's end of its pipe: channel 2) or both None (ValueError if one
 *       only; without them the lane has channels 0 and 1 only). link_pipe: the lane's end of
 *       one more pipe, channel 3, the links ("Links"; ValueError without peer and peer_pipe);
 *       None: no links (the link methods raise ValueError). From start() until stop()
 *       returns the lane thread is the only user of these four (six, seven) sockets and of
 *       every link DEALER it holds.
 *   start()                     spawn the thread (once)
 *   stop()                      idempotent: wake the thread (an eventfd in its poll set), join
 *       it with the GIL released. Before it exits the thread forwards everything waiting on
 *       every pipe to the ROUTERs (and the link pipe's to the links: Python's last sends), then
 *       lets go of the links being removed (released_links lists them).
 *   configure(config_version, max_skew_s)
 *   note(channel, routing_id, promise_ms, gap_s, last_seen, majordomo=0, client_id=b"",
 *        open=True)   insert or update a session; last_seen only ever raises the entry's; gap_s
 *       0 or inf: no gap check; majordomo: 0 = it speaks S0P, else it speaks Majordomo
 *       (the core's Majordomo.speaks) in the reading scale0.core.majordomo.Reading packed:
 *       bit 0 version 1 (MDPC01/MDPW01), bit 1 version 2 (MDP*02), bit 2 delimited (frame 0
 *       empty), bit 3 majortomo's client command numbers (0..15, else ValueError). True (1)
 *       still means "speaks Majordomo" for HEARTBEATs, and is no reading a REQUEST is taken
 *       in or written for. client_id: a frontend session's (UTF-8 bytes); open: its key may
 *       call every service (T1-T4's grant "all"). client_id and open replace the entry's.
 *       On channel 2 (a peer's link on the peer ROUTER) client_id is that peer's broker_id,
 *       1..255 bytes of UTF-8 (ValueError else, empty too) and open says FORWARDs from it may
 *       be taken; promise_ms, gap_s and majordomo are stored there, no rule reads them.
 *   forget(channel, routing_id); clear()
 *   negotiated(channel, fd); gone(channel, fd)                 R20: the negotiated connections
 *       (accepted on channel 2, where no rule reads them: peers do not negotiate R20)
 *   heard() -> [(channel, routing_id, last_seen)]   the entries a HEARTBEAT (or a REQUEST,
 *       REPLY or FORWARD) taken by the lane raised since the last call, and the links a
 *       FORWARDREPLY it took came on (channel 3, the link id), once each, by last_seen
 *       ascending
 *   A channel argument is 0, 1, or 2 when the lane has a peer socket (else ValueError).
 *   last_seen(channel, routing_id) -> float | None
 *   stats() -> dict[str, int]   wakeups, received (from the ROUTERs), beats (taken), passed (to
 *       Python), sent (Python's, to the ROUTERs), send_dropped (of those, and of answers, that
 *       libzmq refused), answers, stalled (a pipe was full), lost (held at stop, or out of
 *       memory), errors (socket errors), marks (Python's "done" marks, see "Order"), requests
 *       and replies (REQUESTs, dispatched or queued, and final REPLYs the lane took, both
 *       families), handed (records adopted by Python), queued (requests the lane put in its
 *       queue, in all), lent (dispatch_head calls), waiting (records in its queues now), cached
 *       (S0P replies the lane put in its reply cache, in all), done (RequestDone records made,
 *       in all), done_full (final REPLYs passed to Python because the ring was full),
 *       forwards (FORWARDs taken, in all; each counts in requests too), forwarded (client
 *       REQUESTs the lane forwarded out, in all; each counts in requests too). Every counter
 *       counts channels 2 and 3 as 0 and 1 (a link's FORWARDREPLY taken: replies). After
 *       stop(): received == beats + requests + replies + passed + lost.
 *   lock(); unlock()            the one lock ("One lock" below), for Python
 *   attach_pool(pool)           share a scale0.core._pool.Pool (None detaches)
 *   serve(on, timeout_s, max_per_client, ticket_prefix, max_queued, may_queue);
 *   python_waits(service, count); python_holds(client_id, count)   the gates ("Requests")
 *   next_seq() -> int; seq_from(n)                              the one numbering ("Records")
 *   adopt(ticket) -> record | None; adopt_worker(routing_id) -> [record];
 *   adopt_all() -> [record]; adopt_due(now) -> [record]; next_due() -> float | None;
 *   waiting_head(service) -> record | None; dispatch_head(service, ticket, worker_rid);
 *   adopt_next_waiting(service) -> record | None; adopt_waiting(service) -> [record];
 *   waiting(service) -> int; waiting_total() -> int;
 *   held(client_id) -> int; busy(client_rid) -> bool; in_flight() -> int;
 *   open_by_connection() -> {client_rid: int}; held_by_client() -> {client_id: int};
 *   held_from(via) -> {service: int}                    (a peer's FORWARDs, "Forwards")
 *   drain() -> (requests, replies, [(service, status, counts, sum_s)], changed, forwards,
 *       forwarded)                                                        ("Records")
 *   serve_forwards(on)          the gate of FORWARDs ("Forwards")
 *   python_key(client_id, request_id, live); python_keys() -> int;
 *   adopt_key(client_id, request_id) -> record | None            ("R10's keys")
 *   cache_limits(max_entries, max_bytes, max_age_s);
 *   cache_put(client_id, request_id, service, status, body, expires);
 *   cache_get(client_id, request_id, now) -> (service, status, body) | None;
 *   cache_prune(now); cache_count() -> int; cache_bytes() -> int;
 *   cache_take() -> [(client_id, request_id, service, status, body, expires)]  ("The reply cache")
 *   record_done(on); done_capacity(n);
 *   done_drain() -> [(service, worker_rid, client_rid, started, finished, bytes_in, bytes_out,
 *       status, via)]                                              ("The RequestDone ring")
 *   add_link(link_id, handle); remove_link(link_id); released_links() -> [link_id]  ("Links")
 *   peer(broker_id, usable, forward_with, free); forget_peer(broker_id);
 *   peer_deltas() -> [(broker_id, service, delta)]; forwarded_to(broker_id) -> {service: int};
 *   identity(name); adopt_peer(broker_id) -> [record]                 ("Forwarding out")
 *
 * Channels: 0 = frontend (S0C1), 1 = backend (S0W1), 2 = the peer ROUTER (S0B1; only when
 * the lane was given peer and peer_pipe). Channel 2 is a channel exactly as 0 and 1: its own
 * pipe, pass-through with the header, Python's sends, Order marks, stall and backpressure, the
 * last sends at stop(); but it takes no HEARTBEAT and has no fd rule (only a FORWARD is taken
 * there, "Forwards"). 3 = the links (S0B1; only with link_pipe), "Links" below.
 *
 * ROUTER -> Python: a message the lane does not take goes to its channel's pipe as [header,
 * routing id, frames...], every frame as received (zmq_msg_send: zero-copy), in order. header:
 * 4 bytes little-endian int32, the connection's fd (ZMQ_SRCFD of the first frame, -1 if none),
 * then, on a keyed channel, the sender's User-Id (zmq_msg_gets) as UTF-8 bytes ("" when none
 * or not UTF-8: recv_batch_keyed's key).
 * Python -> ROUTER: [routing id, frames...] written to a pipe is sent to that channel's ROUTER
 * unchanged (DONTWAIT; a failure is counted in send_dropped). Each wake-up forwards Python's
 * sends before it reads the ROUTERs.
 *
 * The take rule (the fast path of scale0.core.sessions.Sessions.heard_many, its twin): the lane
 * takes a message iff it is exactly [rid, b"", signature, b"HEARTBEAT", options], the options
 * at most max_frame_bytes and read by s0_beat_options, the session table has (channel, rid) and
 * it does not speak Majordomo (the core would note it speaks S0P now), its
 * fd is < 0 or negotiated on the channel, not |time - wall| > max_skew_s, config_version >= the
 * configured one, interval_ms == the entry's promise_ms, and (backend only) not now - the
 * entry's previous last_seen > gap_s (gap_s 0 or inf: no check), and, once Python marks what it
 * has done, no message of the peer still in Python's hands ("Order" below). Before configure()
 * nothing is taken. A frontend beat taken is answered at once: [rid, b"", S0C1, b"HEARTBEAT",
 * {"time":<wall>,"config_version":<configured>[,"interval_ms":<promise_ms>]}], as
 * scale0.wire.client.Heartbeat.to_frames writes it. Every message whose rid has an entry raises
 * its last_seen to now (max), whatever it is.
 *
 * A Majordomo worker's HEARTBEAT (the twin of scale0.core.majordomo.Majordomo.worker_heartbeat,
 * which for a worker with a session only marks it seen: no answer, no skew, version, promise or
 * gap check, whatever protocol the session speaks): on the backend, after configure(), the lane
 * also takes a message iff it is exactly [rid, b"", b"MDPW01", 0x04], [rid, b"", b"MDPW02",
 * 0x05] (majortomo's worker too) or 18/MDP's undelimited [rid, b"MDPW02", 0x05] (every form
 * scale0.wire.registry decodes to MdpWorkerHeartbeat, so max_frame_bytes >= 6), the session
 * table has (1, rid), its fd is < 0 or negotiated, and "Order" allows it. Not answered.
 *
 * Order (optional, on once Python sends its first mark). A message of exactly one 8-byte frame
 * that Python writes to a pipe is not a send but a "done" mark: the number (uint64, little
 * endian) of messages Python has read from that pipe so far, sent after its answers to them
 * (it counts what it reads; the lane numbers what it passes, from 1, in the same order). The
 * take rule then also asks that the peer have no message still in Python's hands: the entry's
 * last passed message, or the last one before Python's latest note() of it, is numbered at most
 * the mark. Else the HEARTBEAT goes to Python too, so the peer sees the answers in the order it
 * sent (a beat after a CHECKCONFIG or a stale HEARTBEAT is answered after Python's answer to
 * that). Without marks the lane answers at once, whatever Python still holds of the peer.
 *
 * Never blocks, never drops a message bound for Python: a ROUTER is read in batches (at most
 * S0_LANE_BUDGET messages per wake-up, one clock read per batch); if its pipe is full (EAGAIN)
 * the rest of the batch is held and that ROUTER is not read until the pipe takes it (the pipe
 * is polled for POLLOUT): backpressure is the ROUTER's RCVHWM, as without a lane. At stop(),
 * what is still held goes to the pipe if it takes it now, else it is counted in "lost" (the
 * only loss: a lane stopped while Python is not reading its pipe).
 *
 * One lock. One recursive mutex guards everything shared: the session table, the request
 * records, the gates, the drain counters and the attached pool. The thread takes it once per
 * batch it reads from a ROUTER and never blocks on anything else while holding it (its sends
 * are DONTWAIT; a full pipe is handled as above) and never takes the GIL. Python takes it with
 * lock() (trylock; if busy, the GIL is released while it waits, so a thread holding the lock is
 * never stuck behind the GIL) and releases it with unlock(); every other method takes it too,
 * the same way, for its own work (recursive: fine inside lock()). lock() counts Python's holds
 * in python_holds (touched only with the GIL held); unlock() without a matching lock(), or from
 * a thread that does not hold it, raises RuntimeError; stop() raises RuntimeError while Python
 * holds it (the thread may be waiting for it: the join would deadlock). The node holds it for
 * the whole of every callback that enters the core, so each compound decision of the core is
 * atomic against the lane. Counters are atomics. The thread uses only these C structures, the
 * pool's C API (scale0/core/_pool_api.h) and libzmq.
 *
 * The pool. attach_pool keeps a reference to the Pool and from then on the thread uses it only
 * under the lock, through the capsule scale0.core._pool._C_API. It sets the pool's guard to
 * python_holds: while it is set every Pool method raises RuntimeError("the pool is shared with
 * a lane: call it under lane.lock()") when Python does not hold the lock. Detaching, or the
 * lane's dealloc, clears it.
 *
 * Requests (Majordomo clients to Majordomo workers here; S0P clients to S0P workers the same
 * way, with the differences in "S0P requests" below).
 * Gates, set by Python: serve(on, timeout_s, max_per_client, ticket_prefix, max_queued,
 * may_queue) (off at start: the node turns it on only when the broker is ACTIVE, not draining,
 * with no event log, no `routes` and a C pool attached; ticket_prefix at most 247 bytes;
 * max_queued: the config's max_queued_requests, Python's waiting and the lane's of a service
 * count against it together; may_queue: the lane may queue, no peer in the family),
 * python_waits(service, count) (how many requests of it wait in Python, R6; 0 forgets it),
 * python_holds(client_id, count) (how many requests of that client Python holds, R20's cap
 * counts them with the lane's). Negative counts: ValueError.
 * A frontend message is taken iff: serve is on and a pool attached; it is exactly a form
 * scale0.wire.registry decodes to MdpClientRequest ([b"", MDPC01, service, body..],
 * [b"", MDPC02, 0x01 or majortomo's 0x02, service, body..], or those of MDPC02 without frame 0),
 * every frame <= max_frame_bytes, the service 1..255 bytes of strict UTF-8 with no ASCII control
 * character (name_frame's rule for ASCII; a non-ASCII name is routed only when the pool offers
 * it, and every name in the pool came through name_frame) and not reserved ("mmi." or
 * "scale0.": is_reserved_service); the session (0, rid) has majordomo == this message's reading,
 * open, promise_ms 0, a negotiated fd (or < 0), and Order allows it; the lane's requests of its
 * client_id (in flight and waiting) + python_holds(client_id) < max_per_client. From here the
 * request counter (request ids) and the shared seq each give it their next number, taken or
 * not (RequestLane does so; the numbers only order). Then either:
 *   dispatch: the pool has a ready worker for the service (peek, the LRU one), the service has
 *     python_waits == 0, and that worker's session (1, wrid) has a reading a REQUEST can be
 *     written in (MDPW01 delimited, MDPW02 delimited or not) and promise_ms 0 (a ready worker
 *     otherwise: passed). Then take, ticket = ticket_prefix + 8 bytes big-endian of the shared
 *     seq's next value (Python numbers its own tickets from it too while the lane is attached:
 *     one sequence, so a worker's tickets sort in issue order), hold(wrid, ticket), the record in flight, the service marked changed, and
 *     the worker is sent MdpWorkerRequest(ticket, body, protocol, delimited) of its reading,
 *     the body frames moved (the record keeps zmq_msg_copy's of them);
 *   queue: no ready worker, may_queue, the pool's offered(service) > 0, and python_waits +
 *     the lane's waiting of the service < max_queued. The record, without ticket or worker,
 *     goes to the back of the lane's queue of the service (logically behind Python's: Python
 *     gives its own waiting first, then the lane's head, dispatch_head); nothing is sent, the
 *     service is not marked changed; queued + 1.
 * Either way the client's counts + 1, requests + 1, the client's entry heard (as a taken
 * beat's). Else the message goes to Python.
 * A backend message is taken iff: serve is on and a pool attached; it is exactly a form the
 * registry decodes to MdpWorkerReply ([b"", MDPW01, 0x03, ticket, b"", body..],
 * [b"", MDPW02, 0x04, ticket, b"", body..] or without frame 0 for MDPW02; not a PARTIAL), every
 * frame <= max_frame_bytes; the ticket is a record of the lane in flight whose worker is this
 * rid (a lane ticket, or Python's given by dispatch_head); the session (1, rid) exists, its fd is
 * negotiated (or < 0), and Order allows it; and, with `services` the worker's services now in
 * the pool (services_of: a READY since may have changed them; in its order), no service of
 * `services` has python_waits > 0, and if one has a non-empty lane queue the worker can be
 * written the head of the first such queue (same family as that head: for a Majordomo head a
 * reading a REQUEST can be written in; promise_ms 0), unless the worker's spare (the pool's,
 * before the release) is below 0: a READY lowered its capacity, it gets no head. Then: the
 * record out, release(wrid, ticket); the first service of `services` whose lane queue is
 * non-empty gives its head to this worker at once if its spare allows (a lane ticket, hold, the service marked changed, the record
 * in flight, its deadline unchanged), else list_ready(wrid); the client's counts - 1, replies +
 * 1, the latency (now - started, negative as 0) into the answered service's histogram
 * (scale0.core.metrics.LATENCY_BUCKETS_S, bisect_left), that service marked changed, the
 * worker's entry heard; the client is sent MdpClientReply(service, body, protocol, delimited,
 * majortomo) of the record's reading, the body frames moved; then the worker, if it got a head,
 * MdpWorkerRequest of its reading with copies of that record's body. Anything else (a PARTIAL,
 * an unknown ticket, another worker's reply) goes to Python unchanged; Python adopts the record
 * when it finds the ticket is not its own. If record_done is on and the ring is full: passed
 * (unchanged, done_full + 1; "The RequestDone ring"). Sends refused by libzmq count in
 * send_dropped (the record of a REQUEST stays: its deadline hands it to Python).
 *
 * Records. One per request the lane holds, in flight (ticket and worker) or waiting (neither):
 * (ticket, worker_rid, client_rid, client_id, caller (the header's CURVE key, "" without),
 * service, body, started (the batch's monotonic clock), deadline (started + timeout_s), its
 * client's family: Majordomo (its reading) or S0P (reading 0), request_id (a Majordomo one's
 * b"mdp.L%d" % n, n the request counter; an S0P one's the client's own), seq). The record owns
 * its body msgs (closed when answered, adopted, or at dealloc). note() of a frontend entry with
 * a nonzero majordomo sets that reading on the Majordomo records of that routing id only (the
 * core answers in the reading spoken last; an S0P record's client stays S0P). A record adopted leaves the lane (a waiting one its queue): an in
 * flight one's slot stays held in the pool under its ticket; its client's count leaves the
 * lane's (Python counts it now); handed + 1. Python adopts with the lock held: adopt(ticket)
 * (in flight only), adopt_worker(routing_id) (in flight, ticket order), adopt_all() (in flight
 * in ticket order, then waiting in seq order), adopt_due(now) (deadline <= now, in flight or
 * waiting, in (deadline, seq) order), adopt_next_waiting(service) (its queue's head),
 * adopt_waiting(service) (its whole queue, in order); each record is the tuple (ticket,
 * worker_rid, client_rid, client_id (bytes), caller (str), service (str), body (tuple of
 * bytes), started, deadline, request_id, seq, ids (bool: True for an S0P client's request,
 * its request_id the client's own, and for a forwarded one with ids; False for a Majordomo
 * one), origin (bytes), via (str), limit (float), peer (str)), ticket and worker_rid b"" for a
 * waiting one; origin, via, limit are a forwarded record's ("Forwards"), b"", "", inf for a
 * client's; peer is the broker id a client's request was forwarded out to ("Forwarding out";
 * worker_rid b"" then), "" otherwise.
 * waiting_head(service): the head's tuple, not removed. dispatch_head(service, ticket,
 * worker_rid): Python freed the worker, took it from the pool and hold(worker_rid, ticket)
 * (any bytes): the head is in flight there under that ticket and stays the lane's (its REPLY is
 * the lane's to answer); lent + 1; KeyError if the queue is empty, ValueError if the ticket is
 * already one of the lane's or worker_rid is not 1..255 bytes; not marked changed; Python sends
 * the REQUEST. One numbering: next_seq() gives the counter's next value (Python calls it for
 * each of its own requests while a lane is attached), seq_from(n) raises it to at least n; each
 * record takes the next value when the lane takes it. next_due(): the earliest deadline held,
 * waiting ones too (a heap); held(client_id), busy(client_rid), open_by_connection(),
 * held_by_client(): in flight and waiting; in_flight(): in flight only; waiting(service),
 * waiting_total(). drain(): (requests, replies, [(service, status, counts (len(buckets) + 1),
 * sum_s)], changed, forwards, forwarded) since the last drain: one histogram per (service,
 * status) the lane answered (a peer's FORWARDREPLY too), sorted by (service, status) (a
 * Majordomo answer is status 200); changed: the services taken or answered, sorted (a request
 * forwarded out and its FORWARDREPLY move no pool slot: not marked); forwards: the FORWARDs
 * taken (in requests too); forwarded: the client REQUESTs forwarded out (in requests too). At
 * stop() the records stay, adoptable.
 * Bounded: records in flight by the pool's slots, waiting by max_queued per service, the gate
 * tables by what Python tells, drain's tables by the services (and statuses) between two drains.
 *
 * S0P requests. Families must match: the lane dispatches (a take, or a freed worker's next
 * head) an S0P record only to a worker whose session speaks S0P (majordomo 0) and a Majordomo
 * record only to one with a reading a REQUEST can be written in; promise_ms 0 either way.
 * A frontend message is also taken iff: serve is on and a pool attached; it is exactly
 * [b"", b"S0C1", b"REQUEST", service, request_id, body..] (scale0.wire.client.ClientRequest),
 * every frame <= max_frame_bytes, the service as for Majordomo (service_ok), the request_id
 * 1..255 bytes (opaque_id); the session (0, rid) has majordomo == 0, open, promise_ms 0, a
 * negotiated fd (or < 0), and Order allows it; R20's cap as for Majordomo; and the key
 * (the entry's client_id, request_id) is not one of Python's keys, not a record of the lane's,
 * and not in the reply cache (cache_get's rule at the batch's clock: an expired entry is
 * dropped and counts as absent). Then the request counter and seq each give it their next
 * number (the counter's only names Majordomo ids; an S0P record keeps the client's request_id),
 * and it is dispatched or queued exactly as a Majordomo one, the LRU ready worker's session
 * speaking S0P with promise_ms 0 (else passed). The worker is sent
 * [b"", b"S0W1", b"REQUEST", ticket, service, body..] (WorkerRequest), or when the pool's
 * ids_of(wrid) says its READY asked for request_ids [b"", b"S0W1", b"IDREQUEST", ticket, service,
 * client_id, request_id, body..] (WorkerIdRequest), the body msgs moved.
 * A backend message is also taken iff it is exactly [b"", b"S0W1", b"REPLY", ticket, status,
 * body..] (WorkerReply; the ticket 1..255 bytes, the status exactly 3 ASCII digits 100..599:
 * status_frame's rule), every frame <= max_frame_bytes, the ticket is a record of the lane in
 * flight at this rid whose client is S0P, and the rest of the Majordomo REPLY rule holds, where
 * "the worker's session has a reading a REQUEST can be written in" now reads "the worker can
 * be written that queue's head" (same family, promise_ms 0). A Majordomo REPLY to an S0P record
 * or an S0P REPLY to a Majordomo one goes to Python (which adopts the record and answers it).
 * Then as a Majordomo REPLY (the record out, release, the next head or list_ready, counts, the
 * latency into the (service, status) histogram, the worker heard), the client is sent
 * [b"", b"S0C1", b"REPLY", service, request_id, status, body..] (ClientReply.to_frames, the
 * status frame as received) and the reply is put in the reply cache under (client_id,
 * request_id), expires = now + max_age_s (its entry made, the body copied, before any change:
 * out of memory, the REPLY goes to Python); cached + 1 when stored.
 *
 * Forwards (docs/protocol.md §5.4; the twin of scale0.core.forwarding.Forwarding.forward_in
 * and scale0.core.dispatch's dispatch_to/finish for a request whose origin is not None). A
 * peer broker's link DEALER sends FORWARD/FORWARDWITH to our peer ROUTER (channel 2); the lane
 * runs the simplest ones on its S0P workers. serve_forwards(on): off at start; serve(False)
 * does not change it, but stops every take. A channel 2 message is taken iff all of:
 *   serve is on, a pool attached, and serve_forwards on;
 *   it is exactly [b"", b"S0B1", b"FORWARD", ticket, service, origin, body..] (6+ frames after
 *   the routing id) or [b"", b"S0B1", b"FORWARDWITH", ticket, service, origin, options,
 *   body..] (7+) with options exactly {"deadline_ms":N} or
 *   {"deadline_ms":N,"client_id":"C","request_id":"H"} (what scale0.wire.peer.Forward.to_frames
 *   writes: json, separators (",", ":"), ensure_ascii): N decimal 1..2**53 without a sign or
 *   leading zero (0 goes to Python, which answers 504), C 1..255 bytes of 0x20..0x7e but '"'
 *   and '' (an escape: passed), H 2..510 lower-case hex digits, an even count (decoded: the
 *   raw request_id, 1..255 bytes); any other options bytes (a "caller", another key order,
 *   spaces) and FORWARDAS (a CURVE caller's) are passed;
 *   every frame <= max_frame_bytes; the ticket 1..255 bytes; the service passes service_ok (a
 *   non-ASCII one is taken only when the pool offers it); origin 1..255 bytes of 0x20..0x7e;
 *   the session (2, rid) exists and is open; Order allows it (channel 2's marks);
 *   with ids (C and H): the key (C, raw request_id) is not one of Python's keys, not a record
 *   of the lane's, and not in the reply cache at the batch's clock (cache_get's rule, an
 *   expired entry dropped): the S0P client rule, one key space with the clients';
 * then (the numbering point, as an S0P REQUEST's: after every check above, before the
 * worker's) the request counter and seq each give it their next number, taken or not; and
 *   dispatch: the pool's LRU ready worker for the service (peek) exists, the service has
 *   python_waits 0, and that worker's session (1, wrid) speaks S0P (majordomo 0) with
 *   promise_ms 0 (a ready worker otherwise: passed); or
 *   queue: no ready worker, the pool's offered(service) > 0 (else Python's 404, F7), and
 *   python_waits + the lane's waiting of the service < max_queued (else Python's 503, R6),
 *   whatever may_queue says (F6: a FORWARD is never forwarded again, so it may wait in the
 *   lane in a family too): the record, without ticket or worker, at the back of the lane's
 *   queue of the service, exactly as a client's queued record (requests + 1, forwards + 1,
 *   queued + 1, the peer heard; nothing sent, the service not marked changed), given a worker
 *   later as any head (a REPLY's next head, or Python's dispatch_head), written as below.
 * Taken and dispatched: ticket = prefix + seq as a client's, hold(wrid, ticket), the record in flight, the
 * service marked changed, requests + 1, forwards + 1, the peer's entry heard; the worker is
 * sent [b"", b"S0W1", b"REQUEST", ticket, service, body..], or if ids_of(wrid)
 * [b"", b"S0W1", b"IDREQUEST", ticket, service, client_id, request_id, body..] with C and the
 * raw request_id, both frames empty without ids (dispatch_to's own = origin is None or ids);
 * the body msgs moved. The record: client_rid the peer's routing id (on channel 2), client_id
 * C with ids, else b"\x00" + the peer entry's client_id (the ledger's key of a forward without
 * ids); caller ""; request_id the raw one with ids, else b""; ids; origin the FORWARD's ticket;
 * via the peer entry's client_id (str); started the batch's clock, limit = started +
 * (double)N / 1000.0 and deadline = fmin(started + timeout_s, limit) (forward_in's doubles,
 * bit for bit; a plain FORWARD: limit +inf, deadline started + timeout_s). Indexed by key (for
 * adopt_key and the key rules) only with ids. A forwarded record counts in no per-client count
 * (held, held_by_client, busy, R20's cap with python_holds), as the ledger's `open` counts only
 * origin-None requests; max_per_client does not apply to it. open_by_connection() counts it by
 * its client_rid (the peer link), as the ledger's counts every request by the routing id it
 * answers; held_from(via) -> {service: count}: the forwarded records of that peer, in flight
 * and waiting (F16's tables count what each peer's forwards hold here).
 * Its S0P final REPLY (channel 1) is taken under the S0P REPLY rule ("S0P requests": the
 * worker's session, python_waits of its services, the next head, which a forwarded record's
 * worker may be given from a local queue; with record_done on, its RequestDone record names
 * the peer, "The RequestDone ring"); then as an S0P REPLY (record out, release, the next head or list_ready, replies
 * + 1, the latency histogram, the service changed, the worker heard), but the answer goes on
 * the peer ROUTER to the record's client_rid: [b"", b"S0B1", b"FORWARDREPLY", origin, status
 * (the frame as received), body..]; with ids the reply goes into the reply cache under (C,
 * request_id) as an S0P answer (made before any change; out of memory: passed), without ids
 * nothing is cached. A Majordomo REPLY, a PARTIAL, another worker's: passed, as for a client's.
 *
 * Links (channel 3, phase 4b; only for a lane made with link_pipe). A link is a DEALER Python
 * made, configured (routing id, CURVE, heartbeats) and connected to a peer broker's peer
 * ROUTER. add_link(link_id, handle): the lane becomes its only user (Python keeps the pyzmq
 * object alive and never touches it again); link_id is the peer's broker id, 1..255 bytes;
 * ValueError if the lane holds a link of that id (one being removed too); the thread polls it
 * from its next wake-up (add_link wakes it: the eventfd, which the thread reads back).
 * remove_link(link_id): KeyError unless the lane holds it (and it is not being removed); the
 * lane stops using it at its next wake-up, after sending everything the link pipe holds then
 * (the pipe is read whole first, past the budget: what Python wrote for it before the call goes
 * out), and lists it once in released_links() (in the order let go; then the list is emptied);
 * only then may Python close its socket. What the link had received and the lane had not read
 * is not read. Records forwarded on it stay the lane's (adopt_peer). Before start() a removal
 * waits for the thread's first wake-up.
 * Link -> Python: every message a link receives that the lane does not take goes to the link
 * pipe as [header, link_id, frames...] (header as on channels 0-2: 4 bytes little-endian of
 * the fd, ZMQ_SRCFD, -1 if unknown; no key), in order per link.
 * Python -> link: [link_id, frames...] written to the link pipe is sent on that link's DEALER
 * as frames... (DONTWAIT); a link not held (unknown, or let go), no frames, or a send libzmq
 * refuses: send_dropped. Python's "done" marks (one 8-byte frame) and Order work as on the
 * other channels, numbered over every link's passed messages; the "peer" of a link message is
 * its link_id: each link keeps the number of its last message passed (last_passed).
 * Reading: at each wake-up the thread takes its copy of the link set under the lock, forwards
 * the pipes, lets go of the links being removed, then reads each link in add order (a budget
 * each) into the channel's one batch: a full link pipe holds the batch and stops the reading of
 * every link until the pipe takes it (backpressure: the links' RCVHWM).
 *
 * Forwarding out (phase 4b; the twin of scale0.core.forwarding.Forwarding.pick_peer and
 * forward_to, and reply_in for a FORWARDREPLY). The lane's view of the peers, set by Python:
 * peer(broker_id, usable, forward_with, free) inserts or replaces one (broker_id 1..255 bytes,
 * ValueError else; free a dict of str to int, TypeError else, checked whole before any change):
 * usable (Peer.usable(): LINKED, ACTIVE, not gossip-dead), forward_with (FORWARD_WITH_NAME in
 * its understands) and per service it offers our estimate of its free slots (peer.free, may be
 * <= 0; a service not in free is not offered). The order of first insertion is kept (a
 * replaced peer keeps its place; one forgotten and told again goes to the back): Python's dict
 * order of family.peers, which pick_peer's ties follow. forget_peer(broker_id) (absent: no
 * error). Its link is the one add_link gave under link_id == broker_id. identity(name): this
 * broker's id, 1..255 bytes, FORWARD's origin_broker; none set, nothing is forwarded.
 * The take rule of a frontend S0P REQUEST ("S0P requests") gains one branch: when it passed
 * every check up to "the pool's LRU ready worker" (the numbering point included) and the pool
 * has NO ready worker for the service (a ready one: dispatched, or passed, as before, whatever
 * its protocol rule says), python_waits(service) == 0, serve_forwards on, identity set and the
 * header names no CURVE caller (Python's FORWARD would carry it: passed), it picks the usable
 * peer offering the service with the most free slots > 0 (ties: the first in order), or, when
 * no worker of the pool offers the service (offered 0), the usable peer offering it with the
 * most free slots however few (<= 0 too; ties: the first): pick_peer(free=False), F6's choice
 * when the service is not ours. None: as before (queued when may_queue and the rest allow,
 * else passed). The picked
 * peer's link not held (never added, or being removed): passed. With forward_with, N =
 * (long long)((deadline - now) * 1000.0), deadline = now + timeout_s (Python's int():
 * truncated, >= 0; not below 9e18, else passed) and the client's client_id must be 1..255
 * bytes of 0x20..0x7e but '"' and '\' (what json writes unescaped), else passed. Then (after
 * everything that can fail) ticket = prefix + 8-byte seq as a dispatch's; the peer's free for
 * the service - 1 and its delta - 1; the record in flight with no worker (worker_rid b"", no
 * pool slot: never held or released) and peer = broker_id; requests + 1, forwarded + 1, the
 * client's entry heard; the service not marked changed; sent on the link (the body msgs moved,
 * the record keeps copies): forward_with:
 * [b"", b"S0B1", b"FORWARDWITH", ticket, service, identity,
 *  {"deadline_ms":N,"client_id":"C","request_id":"H"}, body..] (H the request_id in lower-case
 * hex: Forward.to_frames' bytes), else [b"", b"S0B1", b"FORWARD", ticket, service, identity,
 * body..]. A send refused: send_dropped, the record stays (its deadline hands it to Python).
 * A Majordomo client's REQUEST is never forwarded by the lane.
 * A forwarded-out record counts in its client's counts (held, held_by_client, busy,
 * open_by_connection, R20's cap with python_holds) exactly as a dispatched one, and is
 * indexed by its key (R10: a resend of it is Python's); adopt, adopt_all, adopt_due and
 * adopt_key hand it over as any record, adopt_worker never; adopt_peer(broker_id): every record
 * in flight at that peer, in ticket order (Python calls it before routing them again when the
 * peer is lost, F3). forwarded_to(broker_id) -> {service: count}: the lane's records in flight
 * at that peer (F16's in_flight, the views' "forwarded").
 * A link message is taken iff (FORWARDREPLY, ForwardReply.to_frames): serve is on; it is
 * exactly [b"", b"S0B1", b"FORWARDREPLY", ticket, status, body..], every frame <=
 * max_frame_bytes, the ticket 1..255 bytes, the status 3 ASCII digits 100..599 and neither 404
 * nor 503 (F8: Python adopts the record and routes it again); a record in flight of the lane
 * has that ticket and was forwarded out to this link's link_id; nothing of its service waits:
 * python_waits(its service) == 0 and the lane's own queue of it (peers' FORWARDs) empty (F9:
 * Python's drain_to_peers goes first); Order allows it (the link's last passed message
 * numbered at most channel 3's mark). Then (the histogram's entry, the delta's and the reply
 * cache's entry made before any change; out of memory: passed): the record out; that peer's
 * free for the service + 1 if the lane's view has it, its delta + 1; replies + 1; the latency
 * (now - started, negative as 0) into (service, status)'s histogram; the reply into the reply
 * cache under the record's key exactly as an S0P worker's (cached + 1 when stored); the client
 * is sent [b"", b"S0C1", b"REPLY", service, request_id, status (the frame as received),
 * body..] (ClientReply.to_frames); the link heard: heard() lists (3, link_id, now) once (the
 * family hears that peer then, F3). No RequestDone record (request_done leaves a request a
 * peer answered to that peer). A FORWARDPARTIAL, an unknown ticket, another link's: passed.
 * peer_deltas() -> [(broker_id, service, delta)]: how the lane moved each free count since the
 * last call (-1 per forward, +1 per FORWARDREPLY taken, whether or not the lane's view still
 * has that peer), summed, sorted by (broker_id, service), zero sums left out; emptied. Python
 * applies them to peer.free at the start of every entry and tells peer() again whenever it
 * changed a peer itself.
 * Bounded: links and peers by what Python tells, deltas by (peer, service) pairs between two
 * peer_deltas, records forwarded out by max_per_client per client (R20's cap).
 *
 * R10's keys. A request's key is (client_id, request_id), the core's RequestKey (the client's
 * client_id as UTF-8 bytes, its own request_id). python_key(client_id, request_id, live): the
 * core holds (True) / no longer holds (False) a request not answered yet under that key (a set:
 * inserting twice is one, removing an absent key is no error); the ledger tells it on every
 * open and retire of a request with the client's ids, under the lock. python_keys(): how many.
 * Every record the lane holds of an S0P request is also found by its key in O(1) (a second
 * table over the records); adopt_key(client_id, request_id) hands that record over (in flight
 * or waiting) exactly as adopt(ticket) does, None if the lane has none.
 *
 * The reply cache (the twin of scale0.core.requests.ReplyCache, the lane's own, under the
 * lock). Entries by key -> (expires (monotonic), size (the sum of the body frames' lengths),
 * service, status, body (copied into the entry's own memory, not zmq msgs: a cached body never
 * pins a receive buffer)); first in, first out: insertion order is expiry order, a hit does not
 * refresh. cache_limits(max_entries, max_bytes, max_age_s): defaults 10000, 64 MiB, 60.0
 * (scale0.core.ledger's REPLY_CACHE_*), ValueError on a negative (or NaN); new limits apply from
 * the next put (as ReplyCache's attributes). cache_put(..., expires): ReplyCache.put with
 * now + max_age_s replaced by expires: a body larger than max_bytes is not stored and an entry
 * of that key stays; else an entry of the key is dropped first, the new one goes to the back,
 * then the oldest are evicted while entries > max_entries or bytes > max_bytes (status 100..599,
 * body a tuple of bytes: checked before any change). cache_get(key, now): None if absent; an
 * entry whose expires < now is dropped and None returned. cache_prune(now): drop from the
 * oldest while expires < now. cache_take(): every entry, oldest first, the cache emptied (the
 * ledger takes them back when the lane detaches). Bounded by its limits; freed at dealloc.
 *
 * The RequestDone ring (the event log's `request` records, scale0.core.records.request_done:
 * the lane serves while the broker writes an event log). record_done(on) (off at start): while
 * on, every final REPLY the lane takes (S0P or Majordomo, a client's or a peer's FORWARD's)
 * appends one record to a bounded ring, but a FORWARD's answered 404 or 503 (it goes back to
 * its origin, which routes it again and records it: request_done makes none either),
 * made after every check of the take rule passed and before anything changes or is sent; off,
 * none is made (turning it off keeps what the ring holds for the next drain). A record:
 * (service (str), worker_rid (the worker that replied), client_rid (the routing id the answer
 * goes to), started (the request record's: the batch's monotonic clock when the lane took the
 * REQUEST, or Python's for a lent head), finished (the REPLY batch's monotonic clock, the
 * latency histogram's: finished - started as is, negative allowed), bytes_in (the sum of the
 * request body's frame sizes), bytes_out (the sum of the reply body's frame sizes, what the
 * client is sent as body), status (the S0P worker's; 200 for a Majordomo reply), via (a
 * FORWARD's: the peer's broker id, its client_rid then the peer link's; "" for a client's));
 * done + 1.
 * done_capacity(n): the bound, default 65536 (ValueError if n < 1 or below what the ring holds
 * now). The ring full, the REPLY is not taken: it goes to Python unchanged (Python adopts the
 * record by its ticket, answers and logs it), so no record is lost; done_full + 1. Out of
 * memory for a record: passed too. done_drain(): every record in the order the REPLYs were
 * taken, the ring emptied (the tuples made first: a MemoryError leaves it whole). Records own
 * their strings (copied), are freed at drain and at dealloc; the thread makes no Python object.
 */
#define PY_SSIZE_T_CLEAN
#define _GNU_SOURCE
#include <Python.h>
#include <errno.h>
#include <locale.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "../_table.h"
#include "../core/_pool_api.h"
#include "_zmqio.h"

#define S0_LANE_BUDGET 256 /* messages read per socket per wake-up */
#define S0_LANE_INLINE_FRAMES 8
#define S0_LANE_MAX_FD (1 << 24)
#define S0_CHANNELS 4 /* frontend, backend, peer (the peer ROUTER only when the lane has one),
                       * links (the link DEALERs, only with a link pipe) */
#define S0_LINKS 3    /* the channel of the links */

static const char *const SIGNATURES[2] = {"S0C1", "S0W1"};

/* ---- the session table ------------------------------------------------------------------- */

typedef struct {
    s0_key key; /* the routing id */
    long long promise_ms;
    double gap_s;
    double last_seen;
    Py_ssize_t heard_at; /* index in the lane's heard list, -1 if not in it */
    int channel;
    int majordomo;        /* 0: S0P; else its Majordomo reading (READ_* bits, see note()) */
    int open;             /* its key may call every service (T1-T4 grant "all") */
    uint64_t last_passed; /* the number of its last message passed to Python (see "Order") */
    unsigned char *client_id; /* a frontend session's client_id (malloc'd, NULL: none) */
    size_t client_id_len;
} s0_entry;

static void entry_free(s0_entry *e) {
    if (e != NULL)
        free(e->client_id);
    free(e);
}

typedef struct {
    s0_table entries[S0_CHANNELS];
    unsigned char *negotiated[S0_CHANNELS]; /* one byte per fd */
    size_t negotiated_cap[S0_CHANNELS];
    s0_entry **heard;
    size_t n_heard, heard_cap;
    int configured;
    long long config_version;
    double max_skew_s;
    uint64_t passed_seq[S0_CHANNELS]; /* messages passed to Python per channel, numbered from 1 */
    uint64_t done_seq[S0_CHANNELS]; /* (the thread's own) Python's last "done" mark per channel */
    int ordered[S0_CHANNELS]; /* (the thread's own) a mark came: the order rule is on */
} s0_sessions;

static s0_entry *entry_find(s0_sessions *t, int channel, const unsigned char *rid, size_t len) {
    return (s0_entry *)table_find(&t->entries[channel], rid, len, hash_bytes(rid, len));
}

static void heard_drop(s0_sessions *t, s0_entry *e) {
    if (e->heard_at < 0)
        return;
    size_t i = (size_t)e->heard_at;
    s0_entry *last = t->heard[--t->n_heard];
    t->heard[i] = last;
    last->heard_at = (Py_ssize_t)i;
    e->heard_at = -1;
}

/* 0, or -1 out of memory (the entry is then not listed; heard() misses it once). */
static int heard_add(s0_sessions *t, s0_entry *e) {
    if (e->heard_at >= 0)
        return 0;
    if (t->n_heard == t->heard_cap) {
        size_t cap = t->heard_cap ? 2 * t->heard_cap : 64;
        s0_entry **grown = realloc(t->heard, cap * sizeof(*grown));
        if (grown == NULL)
            return -1;
        t->heard = grown;
        t->heard_cap = cap;
    }
    e->heard_at = (Py_ssize_t)t->n_heard;
    t->heard[t->n_heard++] = e;
    return 0;
}

static void sessions_clear(s0_sessions *t) {
    for (int c = 0; c < S0_CHANNELS; c++) {
        s0_table *tab = &t->entries[c];
        if (tab->slots != NULL)
            for (size_t i = 0; i <= tab->mask; i++)
                entry_free((s0_entry *)tab->slots[i]);
        free(tab->slots);
        tab->slots = NULL;
        tab->mask = 0;
        tab->used = 0;
    }
    t->n_heard = 0;
}

static void sessions_free(s0_sessions *t) {
    sessions_clear(t);
    for (int c = 0; c < S0_CHANNELS; c++) {
        free(t->negotiated[c]);
        t->negotiated[c] = NULL;
        t->negotiated_cap[c] = 0;
    }
    free(t->heard);
    t->heard = NULL;
    t->heard_cap = 0;
}

static int is_negotiated(const s0_sessions *t, int channel, int fd) {
    return fd < 0 || ((size_t)fd < t->negotiated_cap[channel] && t->negotiated[channel][fd]);
}

/* ---- a message read from a ROUTER ------------------------------------------------------------ */

typedef struct {
    s0_zmq_msg_t *frames; /* inline or heap */
    size_t n, cap;
    s0_zmq_msg_t inline_frames[S0_LANE_INLINE_FRAMES];
    int fd;
    int take;            /* taken by the lane: TAKE_BEAT (answered on the frontend, dropped),
                            TAKE_REQUEST or TAKE_REPLY (already sent on, under the lock) */
    long long promise;   /* the answer's interval_ms (0: none) */
    char *header;        /* inline or heap */
    size_t header_len;
    size_t lid_len;      /* channel 3: the link's id, in header after header_len bytes */
    char inline_header[4 + 64];
} s0_message;

static void message_close(s0_message *m) {
    for (size_t i = 0; i < m->n; i++)
        p_msg_close(&m->frames[i]);
    if (m->frames != m->inline_frames)
        free(m->frames);
    if (m->header != m->inline_header)
        free(m->header);
    m->frames = m->inline_frames;
    m->cap = S0_LANE_INLINE_FRAMES;
    m->n = 0;
    m->header = m->inline_header;
    m->header_len = 0;
    m->lid_len = 0;
}

/* Strict UTF-8 (what Python's decoder accepts): no overlong forms, surrogates or > U+10FFFF. */
static int utf8_valid(const unsigned char *s, size_t n) {
    size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            i++;
            continue;
        }
        size_t len;
        unsigned char lo = 0x80, hi = 0xBF;
        if (c >= 0xC2 && c <= 0xDF) {
            len = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            len = 3;
            if (c == 0xE0)
                lo = 0xA0;
            else if (c == 0xED)
                hi = 0x9F;
        } else if (c >= 0xF0 && c <= 0xF4) {
            len = 4;
            if (c == 0xF0)
                lo = 0x90;
            else if (c == 0xF4)
                hi = 0x8F;
        } else {
            return 0;
        }
        if (n - i < len)
            return 0;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return 0;
        for (size_t k = 2; k < len; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF)
                return 0;
        i += len;
    }
    return 1;
}

/* ---- R10's keys and the reply cache -------------------------------------------------------- */

/* A request's key (client_id, request_id) as one byte string: 4 bytes little-endian of
 * len(client_id), the client_id, the request_id. */
typedef struct {
    unsigned char *data;
    size_t len;
    unsigned char inline_buf[4 + 255 + 255];
} s0_rkey;

/* 0, or -1 out of memory. */
static int rkey_make(s0_rkey *k, const void *cid, size_t cid_len, const void *rq, size_t rq_len) {
    k->len = 4 + cid_len + rq_len;
    k->data = k->len <= sizeof(k->inline_buf) ? k->inline_buf : malloc(k->len);
    if (k->data == NULL || cid_len > UINT32_MAX) {
        if (k->data != k->inline_buf)
            free(k->data);
        k->data = k->inline_buf;
        return -1;
    }
    uint32_t n = (uint32_t)cid_len;
    for (int i = 0; i < 4; i++)
        k->data[i] = (unsigned char)(n >> (8 * i));
    if (cid_len)
        memcpy(k->data + 4, cid, cid_len);
    if (rq_len)
        memcpy(k->data + 4 + cid_len, rq, rq_len);
    return 0;
}

static void rkey_free(s0_rkey *k) {
    if (k->data != k->inline_buf)
        free(k->data);
    k->data = k->inline_buf;
}

/* The client_id and request_id of a key made by rkey_make. */
static void rkey_split(const unsigned char *key, size_t len, const unsigned char **cid,
                       size_t *cid_len, const unsigned char **rq, size_t *rq_len) {
    uint32_t n = 0;
    for (int i = 3; i >= 0; i--)
        n = (n << 8) | key[i];
    *cid = key + 4;
    *cid_len = n;
    *rq = key + 4 + n;
    *rq_len = len - 4 - n;
}

/* One final reply kept (scale0.core.requests.ReplyCache's entry): one allocation, the record,
 * its body lengths, its service, its body bytes end to end, then its key. */
typedef struct s0_cent {
    s0_key key; /* (client_id, request_id) as rkey_make writes it */
    struct s0_cent *prev, *next; /* oldest first */
    double expires;
    size_t size; /* the sum of the body frames' lengths */
    int status;
    const unsigned char *service;
    size_t service_len;
    size_t n_body;
    size_t *lens;
    const unsigned char *data;
} s0_cent;

/* The reply cache: first in, first out (a hit does not refresh), bounded by entries, body
 * bytes and age (the lane's own; guarded by the lock). */
typedef struct {
    s0_table t;
    s0_cent *head, *tail;
    size_t bytes;
    long long max_entries, max_bytes;
    double max_age_s;
} s0_cache;

/* A new entry, in no table, NULL out of memory; with room for it in the cache's table. */
static s0_cent *cache_entry(s0_cache *c, const unsigned char *key, size_t key_len,
                            const void *service, size_t service_len, int status, size_t n_body,
                            const unsigned char *const *body, const size_t *lens,
                            double expires) {
    size_t size = 0;
    for (size_t i = 0; i < n_body; i++)
        size += lens[i];
    size_t head = sizeof(s0_cent) + n_body * sizeof(size_t) + service_len + size;
    if (table_reserve(&c->t, 1) < 0)
        return NULL;
    s0_cent *e = record_new(head, key, key_len, hash_bytes(key, key_len));
    if (e == NULL)
        return NULL;
    unsigned char *p = (unsigned char *)e + sizeof(s0_cent);
    e->lens = (size_t *)p;
    p += n_body * sizeof(size_t);
    if (service_len)
        memcpy(p, service, service_len);
    e->service = p;
    e->service_len = service_len;
    p += service_len;
    e->data = p;
    for (size_t i = 0; i < n_body; i++) {
        e->lens[i] = lens[i];
        if (lens[i])
            memcpy(p, body[i], lens[i]);
        p += lens[i];
    }
    e->n_body = n_body;
    e->size = size;
    e->status = status;
    e->expires = expires;
    return e;
}

static void cache_drop(s0_cache *c, s0_cent *e) {
    if (e->prev)
        e->prev->next = e->next;
    else
        c->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->tail = e->prev;
    table_remove(&c->t, &e->key);
    c->bytes -= e->size;
    free(e);
}

static s0_cent *cache_find(const s0_cache *c, const unsigned char *key, size_t len) {
    return (s0_cent *)table_find(&c->t, key, len, hash_bytes(key, len));
}

/* ReplyCache.put with an entry made by cache_entry (never fails): a body larger than max_bytes
 * is not stored (an entry of that key stays); else an entry of the key is dropped first, this
 * one goes to the back, then the oldest are evicted while there are too many or too many
 * bytes. 1 stored, 0 not (e freed). */
static int cache_commit(s0_cache *c, s0_cent *e) {
    if ((long long)e->size > c->max_bytes) {
        free(e);
        return 0;
    }
    s0_cent *old = cache_find(c, e->key.data, e->key.len);
    if (old != NULL)
        cache_drop(c, old);
    e->next = NULL;
    e->prev = c->tail;
    if (c->tail)
        c->tail->next = e;
    else
        c->head = e;
    c->tail = e;
    table_insert(&c->t, &e->key); /* (cache_entry reserved room, and one may have left) */
    c->bytes += e->size;
    while (c->head != NULL &&
           ((long long)c->t.used > c->max_entries || (long long)c->bytes > c->max_bytes))
        cache_drop(c, c->head);
    return 1;
}

/* ReplyCache.get's lookup: the entry of `key`, NULL if none; an expired one (expires < now) is
 * dropped and NULL returned. */
static s0_cent *cache_lookup(s0_cache *c, const unsigned char *key, size_t len, double now) {
    s0_cent *e = cache_find(c, key, len);
    if (e != NULL && e->expires < now) {
        cache_drop(c, e);
        return NULL;
    }
    return e;
}

/* A copy of the entry (in no table, pointers into itself), NULL out of memory. */
static s0_cent *cache_clone(const s0_cent *e) {
    size_t size = sizeof(s0_cent) + e->n_body * sizeof(size_t) + e->service_len + e->size;
    s0_cent *copy = malloc(size + e->key.len);
    if (copy == NULL)
        return NULL;
    memcpy(copy, e, size + e->key.len);
    unsigned char *base = (unsigned char *)copy;
    const unsigned char *from = (const unsigned char *)e;
    copy->key.data = base + (e->key.data - from);
    copy->lens = (size_t *)(base + ((const unsigned char *)e->lens - from));
    copy->service = base + (e->service - from);
    copy->data = base + (e->data - from);
    copy->prev = copy->next = NULL;
    return copy;
}

static void cache_prune(s0_cache *c, double now) {
    while (c->head != NULL && c->head->expires < now)
        cache_drop(c, c->head);
}

static void cache_free(s0_cache *c) {
    for (s0_cent *e = c->head, *next; e != NULL; e = next) {
        next = e->next;
        free(e);
    }
    free(c->t.slots);
    memset(&c->t, 0, sizeof(c->t));
    c->head = c->tail = NULL;
    c->bytes = 0;
}

/* ---- the lane ------------------------------------------------------------------------------ */

enum {
    ST_WAKEUPS,
    ST_RECEIVED,
    ST_BEATS,
    ST_PASSED,
    ST_SENT,
    ST_SEND_DROPPED,
    ST_ANSWERS,
    ST_STALLED,
    ST_LOST,
    ST_ERRORS,
    ST_MARKS,
    ST_REQUESTS,
    ST_REPLIES,
    ST_HANDED,
    ST_QUEUED,
    ST_LENT,
    ST_CACHED,
    ST_DONE,
    ST_DONE_FULL,
    ST_FORWARDS,
    ST_FORWARDED,
    ST_COUNT,
};

enum { TAKE_NONE, TAKE_BEAT, TAKE_REQUEST, TAKE_REPLY, TAKE_FORWARD };

/* A Majordomo reading packed (scale0.core.majordomo.Reading; note()'s majordomo). */
#define READ_V1 1        /* MDPC01 / MDPW01 */
#define READ_V2 2        /* MDPC02 / MDPW02 */
#define READ_DELIMITED 4 /* frame 0 is the empty delimiter */
#define READ_MAJORTOMO 8 /* majortomo's client command numbers */

static const char *const STAT_NAMES[ST_COUNT] = {
    "wakeups", "received", "beats", "passed", "sent", "send_dropped", "answers", "stalled",
    "lost", "errors", "marks", "requests", "replies", "handed", "queued", "lent", "cached",
    "done", "done_full", "forwards", "forwarded",
};

/* One RequestDone record (record_done, "The RequestDone ring"): one allocation, its strings
 * (service, worker_rid, client_rid, via) in data, in that order. */
typedef struct {
    double started, finished;
    unsigned long long bytes_in, bytes_out;
    int status;
    size_t service_len, wrid_len, crid_len, via_len;
    unsigned char data[];
} s0_done;

typedef struct {
    void *router;
    void *pipe;
    int keyed;
    s0_message batch[S0_LANE_BUDGET];
    size_t count;  /* messages in batch */
    size_t cursor; /* the next one to deliver; cursor < count: held (the pipe was full) */
} s0_channel;

/* A link DEALER Python gave the lane (add_link; channel 3): one allocation, its id after it. */
typedef struct {
    void *sock;
    int removing;         /* remove_link called: released at the thread's next wake-up */
    uint64_t last_passed; /* the number of its last message passed to Python ("Order") */
    double last_seen;     /* when the lane last took a FORWARDREPLY from it (heard()) */
    int heard;            /* it did since the last heard() */
    size_t id_len;
    unsigned char id[];   /* the peer's broker id */
} s0_link;

/* The lane's view of a peer broker (peer()): one allocation, its broker id in key. */
typedef struct {
    s0_key key;       /* the broker id */
    int usable;       /* LINKED, ACTIVE, not gossip-dead */
    int forward_with; /* it understands FORWARDWITH */
    s0_table free;    /* service (UTF-8) -> s0_count: our estimate of its free slots (may be <= 0) */
} s0_peer;

typedef struct {
    PyObject_HEAD
    s0_channel ch[S0_CHANNELS];
    int n_ch;  /* the ROUTER channels: 2, or 3 with the peer ROUTER */
    int links; /* channel 3 (the links) exists: a link pipe was given */
    Py_ssize_t max_frame_bytes;
    int wake_fd;
    int started, stopped, joined;
    pthread_t thread;
    pthread_mutex_t join_mutex; /* one stop() joins; a concurrent one waits for it */
    pthread_mutex_t mutex; /* recursive: the one lock ("One lock" above) */
    s0_sessions sessions;
    uint64_t stats[ST_COUNT];
    int stop_flag;
    int python_holds; /* lock() calls not yet unlocked (touched only with the GIL held) */
    /* Below: guarded by `mutex`. The gates Python sets. */
    int serving;
    double timeout_s;
    long long max_per_client;
    unsigned char prefix[255];
    size_t prefix_len;
    long long max_queued;
    int may_queue;
    s0_table waits; /* service -> how many of its requests wait in Python (s0_count) */
    s0_table holds; /* client_id -> how many of its requests Python holds (s0_count) */
    /* The shared pool (attach_pool), NULL if none; pool_obj is our reference to it. */
    PyObject *pool_obj;
    struct s0_pool *pool;
    /* The requests the lane holds. */
    s0_table records;        /* by ticket */
    struct s0_record **heap; /* every record, in flight or waiting, by (deadline, seq) */
    size_t n_heap, heap_cap;
    s0_table client_counts; /* client_id -> records of it */
    s0_table rid_counts;    /* client routing id -> records of it */
    uint64_t number;        /* the last request number given (request ids) */
    uint64_t tickets;       /* the last lane ticket number given */
    uint64_t seq;           /* the one numbering shared with Python (next_seq, seq_from) */
    s0_table wqueues;       /* service -> s0_wq: the lane's waiting requests */
    size_t n_waiting;       /* records in the wqueues */
    s0_table lkeys; /* (client_id, request_id) -> the S0P record of that key (its ikey) */
    s0_table pkeys; /* (client_id, request_id): Python's requests not answered yet (s0_count) */
    s0_cache cache; /* the reply cache (R10) */
    /* What drain() hands over. */
    s0_table svcs;  /* service -> s0_svc */
    s0_table hists; /* (service, status) -> s0_hist */
    uint64_t drain_requests, drain_replies, drain_forwards;
    int serve_forwards; /* the gate serve_forwards(on): FORWARDs may be taken ("Forwards") */
    /* The RequestDone ring: a circular buffer of done_n records from done_head, grown on demand
     * (done_cap slots) up to done_limit records. */
    int record_done;
    s0_done **done;
    size_t done_cap, done_head, done_n, done_limit;
    /* Phase 4b: the links (channel 3) and the peers the lane forwards to. Guarded by `mutex`:
     * link_set (every link held, in add order), gone (links let go, for released_links),
     * peers (in first insertion order), deltas, identity. The thread's own: snap (its copy of
     * link_set, taken under the lock at each wake-up) and items (its poll set). */
    s0_link **link_set;
    size_t n_links, links_cap;
    s0_link **gone; /* links let go by the thread, not yet listed by released_links() */
    size_t n_gone, gone_cap;
    s0_peer **peers;
    size_t n_peers, peers_cap;
    s0_table deltas; /* (broker id, service) as rkey_make writes it -> s0_count: peer_deltas */
    unsigned char identity[255];
    size_t identity_len;
    uint64_t drain_forwarded;
    s0_link **snap;
    size_t n_snap, snap_cap;
    s0_zmq_pollitem_t *items;
    size_t items_cap;
} LaneObject;

static const s0_pool_api *pool_api; /* set by the first attach_pool (PyCapsule_Import) */

static void count(LaneObject *self, int which, uint64_t n) {
    __atomic_fetch_add(&self->stats[which], n, __ATOMIC_RELAXED);
}

static double clock_of(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Receive one whole message into m (closed before). 1: one was read; 0: none waiting (EAGAIN);
 * -1: a socket error (errno in *err). */
static int receive_message(void *sock, s0_message *m, int keyed, int *err) {
    m->n = 0;
    int more = 1;
    while (more) {
        if (m->n == m->cap) {
            size_t cap = m->cap * 2;
            s0_zmq_msg_t *grown;
            if (m->frames == m->inline_frames) {
                grown = malloc(cap * sizeof(*grown));
                if (grown != NULL)
                    memcpy(grown, m->inline_frames, sizeof(m->inline_frames));
            } else {
                grown = realloc(m->frames, cap * sizeof(*grown));
            }
            if (grown == NULL) { /* out of memory: the message is lost, counted */
                s0_zmq_msg_t scratch;
                while (more) {
                    p_msg_init(&scratch);
                    more = recv_frame(sock, &scratch) == 0 && p_msg_more(&scratch);
                    p_msg_close(&scratch);
                }
                message_close(m);
                *err = ENOMEM;
                return -1;
            }
            m->frames = grown;
            m->cap = cap;
        }
        s0_zmq_msg_t *f = &m->frames[m->n];
        p_msg_init(f);
        int rc = recv_frame(sock, f);
        if (rc != 0) {
            p_msg_close(f);
            if (rc == EAGAIN && m->n == 0)
                return 0;
            message_close(m);
            *err = rc;
            return -1;
        }
        m->n++;
        more = p_msg_more(f);
    }
    int fd = p_msg_get(&m->frames[0], S0_ZMQ_SRCFD);
    m->fd = fd < 0 ? -1 : fd;
    const char *uid = keyed ? p_msg_gets(&m->frames[0], "User-Id") : NULL;
    size_t uid_len = uid ? strlen(uid) : 0;
    if (uid_len && !utf8_valid((const unsigned char *)uid, uid_len))
        uid_len = 0;
    m->header = m->inline_header;
    if (4 + uid_len > sizeof(m->inline_header)) {
        m->header = malloc(4 + uid_len);
        if (m->header == NULL) {
            m->header = m->inline_header;
            uid_len = 0; /* out of memory: the key is lost, not the message */
        }
    }
    uint32_t v = (uint32_t)(int32_t)m->fd;
    m->header[0] = (char)(v & 0xff);
    m->header[1] = (char)((v >> 8) & 0xff);
    m->header[2] = (char)((v >> 16) & 0xff);
    m->header[3] = (char)((v >> 24) & 0xff);
    if (uid_len)
        memcpy(m->header + 4, uid, uid_len);
    m->header_len = 4 + uid_len;
    m->take = 0;
    return 1;
}

static int frame_is(s0_zmq_msg_t *f, const char *text, size_t len) {
    return p_msg_size(f) == len && (len == 0 || memcmp(p_msg_data(f), text, len) == 0);
}

/* Whether frames 1.. of m are exactly a Majordomo worker HEARTBEAT as the registry decodes it
 * to MdpWorkerHeartbeat (scale0/wire/registry.py, scale0/wire/mdp.py): [b"", b"MDPW01", 0x04],
 * [b"", b"MDPW02", 0x05], or 18/MDP's undelimited [b"MDPW02", 0x05]; every frame at most
 * max_frame_bytes (an MDPW01 without its empty frame is malformed there: not this). */
static int mdp_worker_beat(s0_message *m, Py_ssize_t max_frame_bytes) {
    s0_zmq_msg_t *f = m->frames;
    if (max_frame_bytes < 6)
        return 0;
    if (m->n == 4 && frame_is(&f[1], "", 0))
        return (frame_is(&f[2], "MDPW01", 6) && frame_is(&f[3], "\x04", 1)) ||
               (frame_is(&f[2], "MDPW02", 6) && frame_is(&f[3], "\x05", 1));
    return m->n == 3 && frame_is(&f[1], "MDPW02", 6) && frame_is(&f[2], "\x05", 1);
}

/* Whether the take rule takes the message (the mutex held); raises the entry's last_seen. */
static int takes(LaneObject *self, int channel, s0_message *m, s0_entry *e, double now,
                 double wall) {
    s0_sessions *t = &self->sessions;
    double previous = e->last_seen;
    if (now > e->last_seen)
        e->last_seen = now;
    if (!t->configured || channel == 2)
        return 0; /* (no HEARTBEAT is taken on the peer ROUTER) */
    /* A Majordomo worker's HEARTBEAT: Majordomo.worker_heartbeat only marks its session heard
     * (Sessions.seen: no answer, no skew, version, promise or gap to check) */
    if (channel == 1 && mdp_worker_beat(m, self->max_frame_bytes))
        return is_negotiated(t, channel, m->fd) &&
               !(t->ordered[channel] && e->last_passed > t->done_seq[channel]);
    if (e->majordomo || m->n != 5 || !frame_is(&m->frames[1], "", 0) ||
        !frame_is(&m->frames[2], SIGNATURES[channel], 4) ||
        !frame_is(&m->frames[3], "HEARTBEAT", 9) ||
        p_msg_size(&m->frames[4]) > (size_t)self->max_frame_bytes)
        return 0;
    double sent;
    long long version, interval;
    if (!s0_beat_options(p_msg_data(&m->frames[4]), p_msg_size(&m->frames[4]), &sent, &version,
                         &interval))
        return 0;
    if (!is_negotiated(t, channel, m->fd) || fabs(sent - wall) > t->max_skew_s ||
        version < t->config_version || interval != e->promise_ms)
        return 0;
    if (channel == 1 && e->gap_s != 0.0 && !isinf(e->gap_s) && now - previous > e->gap_s)
        return 0;
    /* Order: not while one of its messages is still in Python's hands */
    if (t->ordered[channel] && e->last_passed > t->done_seq[channel])
        return 0;
    return 1;
}

/* ---- the requests the lane holds (phase 3b: Majordomo client to Majordomo worker) ---------- */

/* A key and a number: the per-client counts, and the gate sets (n unused). */
typedef struct {
    s0_key key;
    long long n;
} s0_count;

static s0_count *count_find(const s0_table *t, const void *data, size_t len) {
    return (s0_count *)table_find(t, data, len, hash_bytes(data, len));
}

static long long count_of(const s0_table *t, const void *data, size_t len) {
    s0_count *c = count_find(t, data, len);
    return c != NULL ? c->n : 0;
}

/* The record of `key`, made (n = 0) if it has none; NULL out of memory. */
static s0_count *count_make(s0_table *t, const void *data, size_t len) {
    uint64_t h = hash_bytes(data, len);
    s0_count *c = (s0_count *)table_find(t, data, len, h);
    if (c != NULL)
        return c;
    if (table_reserve(t, 1) < 0 || (c = record_new(sizeof(s0_count), data, len, h)) == NULL)
        return NULL;
    table_insert(t, &c->key);
    return c;
}

/* Free the record if its count is 0 or less. */
static void count_settle(s0_table *t, s0_count *c) {
    if (c != NULL && c->n <= 0) {
        table_remove(t, &c->key);
        free(c);
    }
}

static void count_add(s0_table *t, const void *data, size_t len, long long delta) {
    s0_count *c = count_find(t, data, len);
    if (c != NULL) {
        c->n += delta;
        count_settle(t, c);
    }
}

/* Free every record of a table of plain records (no owned memory of their own). */
static void table_free_all(s0_table *t) {
    if (t->slots != NULL)
        for (size_t i = 0; i <= t->mask; i++)
            free(t->slots[i]);
    free(t->slots);
    t->slots = NULL;
    t->mask = 0;
    t->used = 0;
}

typedef struct s0_wq s0_wq;

#define RECORD_OF_IKEY(k) ((s0_record *)((char *)(k) - offsetof(s0_record, ikey)))

/* A request the lane took: everything Python needs to own it (adopt). One allocation: the
 * record, its body msgs, then its byte strings. Its key is the ticket (len 0 while it waits in
 * a queue), in ticket_buf or, for a longer ticket Python gives (dispatch_head), ticket_heap. */
typedef struct s0_record {
    s0_key key; /* the ticket */
    const unsigned char *crid, *client_id, *caller, *service;
    size_t wrid_len, crid_len, client_id_len, caller_len, service_len;
    unsigned char wrid[256]; /* the worker's routing id (wrid_len 0 while waiting) */
    unsigned char ticket_buf[255 + 8];
    unsigned char *ticket_heap;
    s0_zmq_msg_t *body; /* zmq_msg_copy's of the client's body frames */
    size_t n_body;
    double started, deadline;
    int reading;     /* the client's Majordomo reading; 0 for an S0P client */
    int s0p;         /* an S0P request (a client's or a forwarded one): S0P workers only */
    int ids;         /* request_id is the client's own, ikey its key (in lkeys) */
    int fwd;         /* a forwarded request ("Forwards"): its client is a peer, on channel 2 */
    const unsigned char *request_id; /* (ids) the client's request_id */
    size_t request_id_len;
    s0_key ikey;     /* (ids) (client_id, request_id) as rkey_make writes it, in lkeys */
    const unsigned char *origin, *via; /* (fwd) the FORWARD's ticket; the peer's broker id */
    size_t origin_len, via_len;
    double limit; /* (fwd) the client's own deadline (FORWARDWITH's deadline_ms); else +inf */
    int out;      /* forwarded out to a peer ("Forwarding out"): no worker, no pool slot */
    const unsigned char *peer; /* (out) the peer's broker id */
    size_t peer_len;
    uint64_t number; /* request_id b"mdp.L%d" (Majordomo) */
    uint64_t seq;    /* the shared numbering */
    size_t heap_at;
    s0_wq *queue; /* the queue it waits in, NULL when in flight */
    struct s0_record *qprev, *qnext;
} s0_record;

/* One service's queue of waiting records, first in first out; freed when empty. */
struct s0_wq {
    s0_key key; /* the service, UTF-8 */
    s0_record *head, *tail;
    size_t n;
};

static void record_free(s0_record *r) {
    if (r == NULL)
        return;
    for (size_t i = 0; i < r->n_body; i++)
        p_msg_close(&r->body[i]);
    free(r->ticket_heap);
    free(r);
}

/* Give the record its ticket: 0, or -1 out of memory (nothing changed). */
static int record_set_ticket(s0_record *r, const void *ticket, size_t len) {
    unsigned char *to = r->ticket_buf;
    if (len > sizeof(r->ticket_buf)) {
        if ((to = malloc(len)) == NULL)
            return -1;
        free(r->ticket_heap);
        r->ticket_heap = to;
    }
    if (len)
        memcpy(to, ticket, len);
    r->key.data = to;
    r->key.len = len;
    r->key.hash = hash_bytes(to, len);
    return 0;
}

/* A request record with room for n_body body msgs and `strings` bytes of its strings, in one
 * allocation: no ticket yet, its body pointing at that room; *at the first byte for the
 * strings, which S0_PUT fills in order. NULL out of memory. */
static s0_record *record_alloc(size_t n_body, size_t strings, unsigned char **at) {
    size_t body = n_body * sizeof(s0_zmq_msg_t);
    s0_record *r = record_new(sizeof(s0_record) + body + strings, NULL, 0, 0);
    if (r == NULL)
        return NULL;
    record_set_ticket(r, NULL, 0);
    unsigned char *p = (unsigned char *)r + sizeof(s0_record);
    r->body = (s0_zmq_msg_t *)p;
    *at = p + body;
    return r;
}

/* In a take rule, after record_alloc(..., &p): `len` bytes of `data` become record r's `field`
 * (and field_len), p moving past them. */
#define S0_PUT(field, data, len)                                                                  \
    do {                                                                                          \
        if (len)                                                                                  \
            memcpy(p, data, len);                                                                 \
        r->field = p;                                                                             \
        r->field##_len = len;                                                                     \
        p += len;                                                                                 \
    } while (0)


static void record_set_worker(s0_record *r, const void *rid, size_t len) { /* len <= 255 */
    if (len)
        memcpy(r->wrid, rid, len);
    r->wrid_len = len;
}

static s0_wq *wq_find(const LaneObject *self, const void *service, size_t len) {
    return (s0_wq *)table_find(&self->wqueues, service, len, hash_bytes(service, len));
}

static size_t wq_count(const LaneObject *self, const void *service, size_t len) {
    s0_wq *q = wq_find(self, service, len);
    return q != NULL ? q->n : 0;
}

/* The queue of `service`, made (empty) if none; NULL out of memory. */
static s0_wq *wq_make(LaneObject *self, const void *service, size_t len) {
    uint64_t h = hash_bytes(service, len);
    s0_wq *q = (s0_wq *)table_find(&self->wqueues, service, len, h);
    if (q != NULL)
        return q;
    if (table_reserve(&self->wqueues, 1) < 0 ||
        (q = record_new(sizeof(s0_wq), service, len, h)) == NULL)
        return NULL;
    table_insert(&self->wqueues, &q->key);
    return q;
}

/* Free the queue if it is empty. */
static void wq_settle(LaneObject *self, s0_wq *q) {
    if (q != NULL && q->n == 0) {
        table_remove(&self->wqueues, &q->key);
        free(q);
    }
}

static void wq_push(LaneObject *self, s0_wq *q, s0_record *r) {
    r->queue = q;
    r->qnext = NULL;
    r->qprev = q->tail;
    if (q->tail)
        q->tail->qnext = r;
    else
        q->head = r;
    q->tail = r;
    q->n++;
    self->n_waiting++;
}

/* Out of its queue (the queue freed if now empty). */
static void wq_unlink(LaneObject *self, s0_record *r) {
    s0_wq *q = r->queue;
    if (r->qprev)
        r->qprev->qnext = r->qnext;
    else
        q->head = r->qnext;
    if (r->qnext)
        r->qnext->qprev = r->qprev;
    else
        q->tail = r->qprev;
    r->queue = NULL;
    r->qprev = r->qnext = NULL;
    q->n--;
    self->n_waiting--;
    wq_settle(self, q);
}

static int record_before(const s0_record *a, const s0_record *b) {
    return a->deadline < b->deadline || (a->deadline == b->deadline && a->seq < b->seq);
}

static void heap_set(LaneObject *self, size_t i, s0_record *r) {
    self->heap[i] = r;
    r->heap_at = i;
}

static void heap_sift(LaneObject *self, size_t i) {
    s0_record *r = self->heap[i];
    while (i > 0) { /* up */
        size_t parent = (i - 1) / 2;
        if (!record_before(r, self->heap[parent]))
            break;
        heap_set(self, i, self->heap[parent]);
        i = parent;
    }
    for (;;) { /* down */
        size_t child = 2 * i + 1;
        if (child >= self->n_heap)
            break;
        if (child + 1 < self->n_heap && record_before(self->heap[child + 1], self->heap[child]))
            child++;
        if (!record_before(self->heap[child], r))
            break;
        heap_set(self, i, self->heap[child]);
        i = child;
    }
    heap_set(self, i, r);
}

static int heap_reserve(LaneObject *self) {
    if (self->n_heap < self->heap_cap)
        return 0;
    size_t cap = self->heap_cap ? 2 * self->heap_cap : 64;
    s0_record **grown = realloc(self->heap, cap * sizeof(*grown));
    if (grown == NULL)
        return -1;
    self->heap = grown;
    self->heap_cap = cap;
    return 0;
}

static void heap_push(LaneObject *self, s0_record *r) { /* after heap_reserve */
    heap_set(self, self->n_heap++, r);
    heap_sift(self, r->heap_at);
}

static void heap_remove(LaneObject *self, s0_record *r) {
    size_t i = r->heap_at;
    s0_record *last = self->heap[--self->n_heap];
    if (last != r) {
        heap_set(self, i, last);
        heap_sift(self, i);
    }
}

/* A record leaves the lane (answered or handed to Python): out of every table (its queue if it
 * waits), its client's
 * counts down. Its pool slot is the caller's business. */
static void record_out(LaneObject *self, s0_record *r) {
    if (r->queue != NULL)
        wq_unlink(self, r);
    else
        table_remove(&self->records, &r->key);
    if (r->ids)
        table_remove(&self->lkeys, &r->ikey);
    heap_remove(self, r);
    if (!r->fwd) { /* (a forwarded request is in no per-client count) */
        count_add(&self->client_counts, r->client_id, r->client_id_len, -1);
        count_add(&self->rid_counts, r->crid, r->crid_len, -1);
    }
}

/* scale0.core.metrics.LATENCY_BUCKETS_S (tests/net/test_lane_requests.py holds them equal). */
#define S0_BUCKETS 14
static const double BUCKETS_S[S0_BUCKETS] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                                             0.25,  0.5,    1.0,   2.5,  5.0,   10.0, 30.0};

/* What the lane did to one service since the last drain(). */
typedef struct {
    s0_key key;  /* the name, UTF-8 */
    int changed; /* a request taken or answered */
} s0_svc;

/* The latencies of the replies of one (service, status) the lane answered since the last
 * drain(): its key the name (UTF-8) then the status, 2 bytes big-endian. */
typedef struct {
    s0_key key;
    size_t service_len;
    int status;
    int observed; /* a reply's latency is in counts */
    uint64_t counts[S0_BUCKETS + 1];
    double sum_s;
} s0_hist;

static s0_hist *hist_make(LaneObject *self, const void *name, size_t len, int status) {
    unsigned char inline_key[255 + 2];
    unsigned char *key = len <= 255 ? inline_key : malloc(len + 2);
    if (key == NULL)
        return NULL;
    if (len)
        memcpy(key, name, len);
    key[len] = (unsigned char)(status >> 8);
    key[len + 1] = (unsigned char)(status & 0xff);
    uint64_t h = hash_bytes(key, len + 2);
    s0_hist *v = (s0_hist *)table_find(&self->hists, key, len + 2, h);
    if (v == NULL && table_reserve(&self->hists, 1) == 0 &&
        (v = record_new(sizeof(s0_hist), key, len + 2, h)) != NULL) {
        v->service_len = len;
        v->status = status;
        table_insert(&self->hists, &v->key);
    }
    if (key != inline_key)
        free(key);
    return v;
}

static s0_svc *svc_make(LaneObject *self, const void *name, size_t len) {
    uint64_t h = hash_bytes(name, len);
    s0_svc *v = (s0_svc *)table_find(&self->svcs, name, len, h);
    if (v != NULL)
        return v;
    if (table_reserve(&self->svcs, 1) < 0 || (v = record_new(sizeof(s0_svc), name, len, h)) == NULL)
        return NULL;
    table_insert(&self->svcs, &v->key);
    return v;
}

/* bisect_left(LATENCY_BUCKETS_S, seconds): the first bound >= seconds, else the last (+Inf). */
static size_t bucket_of(double seconds) {
    size_t i = 0;
    while (i < S0_BUCKETS && BUCKETS_S[i] < seconds)
        i++;
    return i;
}

/* Whether frames 1.. of m (all but the routing id) are each at most max_frame_bytes: the
 * registry's frame limit, which every message the lane takes must meet. */
static int frames_fit(const s0_message *m, Py_ssize_t max_frame_bytes) {
    for (size_t i = 1; i < m->n; i++)
        if (p_msg_size(&m->frames[i]) > (size_t)max_frame_bytes)
            return 0;
    return 1;
}

/* Whether frames 1.. of m are exactly a Majordomo client REQUEST as scale0.wire.registry decodes
 * it to MdpClientRequest (from a frontend: FRONTEND_SIGNATURES): [b"", MDPC01, service, body..],
 * [b"", MDPC02, 0x01 | 0x02 (majortomo), service, body..], or 18/MDP's undelimited
 * [MDPC02, 0x01 | 0x02, service, body..]; every frame at most max_frame_bytes. *reading: its
 * READ_* bits; *at: the service frame's index. (The service name is checked by the caller.) */
static int mdp_client_request(s0_message *m, Py_ssize_t max_frame_bytes, int *reading, size_t *at) {
    s0_zmq_msg_t *f = m->frames;
    size_t n = m->n;
    if (n < 4)
        return 0;
    if (frame_is(&f[1], "", 0)) {
        if (frame_is(&f[2], "MDPC01", 6)) {
            *at = 3;
            *reading = READ_V1 | READ_DELIMITED;
        } else if (frame_is(&f[2], "MDPC02", 6) &&
                   (frame_is(&f[3], "\x01", 1) || frame_is(&f[3], "\x02", 1))) {
            *at = 4;
            *reading = READ_V2 | READ_DELIMITED |
                       (((const char *)p_msg_data(&f[3]))[0] == 2 ? READ_MAJORTOMO : 0);
        } else {
            return 0;
        }
    } else if (frame_is(&f[1], "MDPC02", 6) &&
               (frame_is(&f[2], "\x01", 1) || frame_is(&f[2], "\x02", 1))) {
        *at = 3;
        *reading = READ_V2 | (((const char *)p_msg_data(&f[2]))[0] == 2 ? READ_MAJORTOMO : 0);
    } else {
        return 0;
    }
    if (n <= *at)
        return 0; /* no service frame: malformed */
    return frames_fit(m, max_frame_bytes);
}

/* Whether frames 1.. of m are exactly a Majordomo worker final reply as the registry decodes it
 * to MdpWorkerReply (from a backend): [b"", MDPW01, 0x03, ticket, b"", body..],
 * [b"", MDPW02, 0x04, ticket, b"", body..] or [MDPW02, 0x04, ticket, b"", body..]; the ticket
 * 1..255 bytes, every frame at most max_frame_bytes. *at: the ticket frame's index. */
static int mdp_worker_reply(s0_message *m, Py_ssize_t max_frame_bytes, size_t *at) {
    s0_zmq_msg_t *f = m->frames;
    size_t n = m->n;
    if (n >= 6 && frame_is(&f[1], "", 0) &&
        ((frame_is(&f[2], "MDPW01", 6) && frame_is(&f[3], "\x03", 1)) ||
         (frame_is(&f[2], "MDPW02", 6) && frame_is(&f[3], "\x04", 1))))
        *at = 4;
    else if (n >= 5 && frame_is(&f[1], "MDPW02", 6) && frame_is(&f[2], "\x04", 1))
        *at = 3;
    else
        return 0;
    size_t ticket = p_msg_size(&f[*at]);
    if (ticket == 0 || ticket > 255 || p_msg_size(&f[*at + 1]) != 0)
        return 0;
    return frames_fit(m, max_frame_bytes);
}

/* A service name the lane may route: 1..255 bytes of strict UTF-8 with no ASCII control
 * character (scale0.wire.frames.name_problem for ASCII; a non-ASCII name is routed only when
 * the pool offers it, and every name in the pool came through name_frame), and not reserved
 * (is_reserved_service: "mmi." or "scale0."). */
static int service_ok(const unsigned char *s, size_t n) {
    if (n == 0 || n > 255 || !utf8_valid(s, n))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x20 || s[i] == 0x7f)
            return 0;
    if ((n >= 4 && memcmp(s, "mmi.", 4) == 0) || (n >= 7 && memcmp(s, "scale0.", 7) == 0))
        return 0;
    return 1;
}

/* A worker's reading the lane can write a REQUEST in: MDPW01 (delimited), MDPW02 delimited or
 * not. (majordomo=True, 1, says only "it speaks Majordomo": not one of these.) */
static int worker_reading(int r) {
    return r == (READ_V1 | READ_DELIMITED) || r == (READ_V2 | READ_DELIMITED) || r == READ_V2;
}

/* Send one message on `router` without blocking: its routing id, `n_head` frames made here,
 * then `n_body` msgs moved (zmq_msg_send). 0, or the errno of the first frame refused. */
static int send_message(void *router, const void *rid, size_t rid_len, const char *const *head,
                        const size_t *head_len, size_t n_head, s0_zmq_msg_t *body,
                        size_t n_body) {
    size_t total = (rid != NULL) + n_head + n_body;
    size_t k = 0;
    int err = 0; /* (rid NULL: a link DEALER, no routing id frame) */
    if (rid != NULL)
        err = send_frame(router, rid, rid_len,
                         S0_ZMQ_DONTWAIT | (++k < total ? S0_ZMQ_SNDMORE : 0));
    for (size_t i = 0; err == 0 && i < n_head; i++)
        err = send_frame(router, head[i], head_len[i],
                         S0_ZMQ_DONTWAIT | (++k < total ? S0_ZMQ_SNDMORE : 0));
    for (size_t i = 0; err == 0 && i < n_body; i++) {
        int flags = S0_ZMQ_DONTWAIT | (++k < total ? S0_ZMQ_SNDMORE : 0);
        for (;;) {
            if (p_msg_send(&body[i], router, flags) >= 0)
                break;
            err = p_errno();
            if (err != EINTR)
                break;
            err = 0;
        }
    }
    return err;
}

/* The lane's next ticket (not given yet): ticket_prefix + 8 bytes big-endian of the shared
 * counter's next value (seq: Python numbers its tickets from it too while a lane is attached,
 * scale0.core.context.Core.next_ticket, so a worker's tickets sort in the order they were
 * issued, whoever issued them: R8 retries them in that order). Given by self->seq++. */
static size_t next_ticket(const LaneObject *self, unsigned char *ticket) {
    memcpy(ticket, self->prefix, self->prefix_len);
    uint64_t v = self->seq + 1;
    for (int k = 0; k < 8; k++)
        ticket[self->prefix_len + (size_t)k] = (unsigned char)(v >> (56 - 8 * k));
    return self->prefix_len + 8;
}

/* Send the record's worker its REQUEST, the body msgs moved; `we` is the worker's session.
 * A Majordomo record: MdpWorkerRequest(ticket, body, protocol, delimited) of the worker's
 * reading. An S0P one: WorkerRequest [b"", S0W1, REQUEST, ticket, service, body..] or, when
 * the pool says the worker asked for ids, WorkerIdRequest [b"", S0W1, IDREQUEST, ticket,
 * service, client_id, request_id, body..]. 0 or the errno. */
static int send_request(LaneObject *self, const s0_record *r, const s0_entry *we,
                        s0_zmq_msg_t *body, size_t n_body) {
    const char *head[7];
    size_t head_len[7], n_head = 0;
#define S0_HEAD(data, len)                                                                        \
    do {                                                                                          \
        head[n_head] = (const char *)(data);                                                      \
        head_len[n_head++] = (len);                                                               \
    } while (0)
    if (r->s0p) {
        int ids = pool_api->ids_of(self->pool, r->wrid, r->wrid_len);
        S0_HEAD("", 0);
        S0_HEAD(SIGNATURES[1], 4);
        if (ids)
            S0_HEAD("IDREQUEST", 9);
        else
            S0_HEAD("REQUEST", 7);
        S0_HEAD(r->key.data, r->key.len);
        S0_HEAD(r->service, r->service_len);
        if (ids && r->ids) {
            S0_HEAD(r->client_id, r->client_id_len);
            S0_HEAD(r->request_id, r->request_id_len);
        } else if (ids) { /* a forwarded request without ids (dispatch_to: own is False) */
            S0_HEAD("", 0);
            S0_HEAD("", 0);
        }
    } else {
        if (we->majordomo & READ_DELIMITED)
            S0_HEAD("", 0);
        S0_HEAD((we->majordomo & READ_V1) ? "MDPW01" : "MDPW02", 6);
        S0_HEAD("\x02", 1);
        S0_HEAD(r->key.data, r->key.len);
        S0_HEAD("", 0);
    }
#undef S0_HEAD
    return send_message(self->ch[1].router, r->wrid, r->wrid_len, head, head_len, n_head, body,
                        n_body);
}

/* Whether the worker of session `we` can be written a REQUEST of this family: an S0P record to
 * a worker speaking S0P, a Majordomo one to a worker whose reading the lane writes; and
 * promise_ms 0 either way. */
static int worker_fits(const s0_entry *we, int s0p) {
    return we != NULL && we->promise_ms == 0 &&
           (s0p ? we->majordomo == 0 : worker_reading(we->majordomo));
}

/* Whether frames 1.. of m are exactly an S0P client REQUEST (scale0.wire.client.ClientRequest):
 * [b"", S0C1, REQUEST, service, request_id, body..], the request_id 1..255 bytes (opaque_id),
 * every frame at most max_frame_bytes. (The service name is checked by the caller.) */
static int s0p_client_request(s0_message *m, Py_ssize_t max_frame_bytes) {
    s0_zmq_msg_t *f = m->frames;
    size_t n = m->n;
    if (n < 6 || !frame_is(&f[1], "", 0) || !frame_is(&f[2], "S0C1", 4) ||
        !frame_is(&f[3], "REQUEST", 7))
        return 0;
    size_t rq = p_msg_size(&f[5]);
    if (rq == 0 || rq > 255)
        return 0;
    return frames_fit(m, max_frame_bytes);
}

/* Whether frames 1.. of m are exactly an S0P worker final REPLY (scale0.wire.worker.WorkerReply):
 * [b"", S0W1, REPLY, ticket, status, body..], the ticket 1..255 bytes, the status exactly 3
 * ASCII digits 100..599 (status_frame), every frame at most max_frame_bytes; *status set. */
static int s0p_worker_reply(s0_message *m, Py_ssize_t max_frame_bytes, int *status) {
    s0_zmq_msg_t *f = m->frames;
    size_t n = m->n;
    if (n < 6 || !frame_is(&f[1], "", 0) || !frame_is(&f[2], "S0W1", 4) ||
        !frame_is(&f[3], "REPLY", 5))
        return 0;
    size_t ticket = p_msg_size(&f[4]);
    if (ticket == 0 || ticket > 255 || p_msg_size(&f[5]) != 3)
        return 0;
    const unsigned char *d = p_msg_data(&f[5]);
    if (d[0] < '1' || d[0] > '5' || d[1] < '0' || d[1] > '9' || d[2] < '0' || d[2] > '9')
        return 0;
    if (!frames_fit(m, max_frame_bytes))
        return 0;
    *status = (d[0] - '0') * 100 + (d[1] - '0') * 10 + (d[2] - '0');
    return 1;
}

/* ---- Forwarding out: the peers the lane forwards to (phase 4b) ------------------------------ */

/* The usable peer offering the service with the most free slots, ties to the first in order
 * (scale0.core.forwarding.Forwarding.pick_peer): with free_only, only one with some (> 0); else
 * any, however few (its first choice when no worker of ours offers the service, F6). NULL if
 * none (the mutex held). */
static s0_peer *pick_peer(const LaneObject *self, const void *svc, size_t svc_len, int free_only) {
    s0_peer *best = NULL;
    long long best_free = 0;
    for (size_t i = 0; i < self->n_peers; i++) {
        s0_peer *p = self->peers[i];
        if (!p->usable)
            continue;
        s0_count *c = count_find(&p->free, svc, svc_len);
        if (c == NULL || (free_only && c->n <= 0) || (best != NULL && c->n <= best_free))
            continue;
        best = p;
        best_free = c->n;
    }
    return best;
}

static s0_peer *peer_find(const LaneObject *self, const void *id, size_t len, size_t *at) {
    for (size_t i = 0; i < self->n_peers; i++) {
        s0_peer *p = self->peers[i];
        if (p->key.len == len && memcmp(p->key.data, id, len) == 0) {
            if (at != NULL)
                *at = i;
            return p;
        }
    }
    return NULL;
}

static void peer_free(s0_peer *p) {
    if (p != NULL)
        table_free_all(&p->free);
    free(p);
}

/* The link of this id the lane holds, NULL if none (or being removed); the mutex held. */
static s0_link *link_find(const LaneObject *self, const void *id, size_t len) {
    for (size_t i = 0; i < self->n_links; i++) {
        s0_link *l = self->link_set[i];
        if (!l->removing && l->id_len == len && memcmp(l->id, id, len) == 0)
            return l;
    }
    return NULL;
}

/* The delta entry of (peer, service), made (n = 0) if none; NULL out of memory. */
static s0_count *delta_make(LaneObject *self, const void *peer, size_t peer_len, const void *svc,
                            size_t svc_len) {
    s0_rkey k;
    if (rkey_make(&k, peer, peer_len, svc, svc_len) < 0)
        return NULL;
    s0_count *c = count_make(&self->deltas, k.data, k.len);
    rkey_free(&k);
    return c;
}

/* Free the delta entry if its sum is 0 (a delta may be negative: not count_settle). */
static void delta_settle(LaneObject *self, s0_count *c) {
    if (c != NULL && c->n == 0) {
        table_remove(&self->deltas, &c->key);
        free(c);
    }
}

/* A client_id FORWARDWITH's options can carry as Forward.to_frames writes it (json.dumps,
 * ensure_ascii): 1..255 bytes of 0x20..0x7e but '"' and '\' (no escape needed). */
static int json_plain(const unsigned char *s, size_t n) {
    if (n == 0 || n > 255)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x20 || s[i] > 0x7e || s[i] == '"' || s[i] == '\\')
            return 0;
    return 1;
}

/* Send the record r forwarded out on its link (the body msgs moved): FORWARDWITH with
 * {"deadline_ms":N,"client_id":"C","request_id":"H"} when the peer understands it, else
 * FORWARD. 0, or the errno. */
static int send_forward(LaneObject *self, const s0_record *r, void *sock, int with,
                        long long deadline_ms, s0_zmq_msg_t *body, size_t n_body) {
    const char *head[7];
    size_t head_len[7];
    char opts[64 + 255 + 510];
    head[0] = "";
    head_len[0] = 0;
    head[1] = "S0B1";
    head_len[1] = 4;
    head[2] = with ? "FORWARDWITH" : "FORWARD";
    head_len[2] = with ? 11 : 7;
    head[3] = (const char *)r->key.data;
    head_len[3] = r->key.len;
    head[4] = (const char *)r->service;
    head_len[4] = r->service_len;
    head[5] = (const char *)self->identity;
    head_len[5] = self->identity_len;
    size_t n_head = 6;
    if (with) {
        static const char hex[] = "0123456789abcdef";
        int len = snprintf(opts, sizeof(opts), "{\"deadline_ms\":%lld,\"client_id\":\"",
                           deadline_ms);
        size_t at = (size_t)len;
        memcpy(opts + at, r->client_id, r->client_id_len);
        at += r->client_id_len;
        memcpy(opts + at, "\",\"request_id\":\"", 16);
        at += 16;
        for (size_t i = 0; i < r->request_id_len; i++) {
            opts[at++] = hex[r->request_id[i] >> 4];
            opts[at++] = hex[r->request_id[i] & 15];
        }
        opts[at++] = '"';
        opts[at++] = '}';
        head[6] = opts;
        head_len[6] = at;
        n_head = 7;
    }
    return send_message(sock, NULL, 0, head, head_len, n_head, body, n_body);
}

/* The take rule for a frontend REQUEST (the mutex held): 1 when taken (dispatched: the
 * worker's REQUEST is sent; or queued), 0 when it goes to Python (nothing changed but the
 * request and seq counters, as tests/core/test_lane_requests.py's RequestLane, and an expired
 * reply cache entry of an S0P request's key dropped). */
static int take_request(LaneObject *self, s0_message *m, s0_entry *e, double now) {
    s0_sessions *t = &self->sessions;
    if (!self->serving || self->pool == NULL)
        return 0;
    int reading = 0, s0p = 0;
    size_t at; /* the service frame */
    if (mdp_client_request(m, self->max_frame_bytes, &reading, &at)) {
    } else if (s0p_client_request(m, self->max_frame_bytes)) {
        s0p = 1;
        at = 4;
    } else {
        return 0;
    }
    size_t body_at = at + 1 + (size_t)s0p; /* (an S0P REQUEST has its request_id first) */
    s0_zmq_msg_t *f = m->frames;
    const unsigned char *svc = p_msg_data(&f[at]);
    size_t svc_len = p_msg_size(&f[at]);
    if (!service_ok(svc, svc_len))
        return 0;
    if (e->majordomo != reading || !e->open || e->promise_ms != 0 || !is_negotiated(t, 0, m->fd))
        return 0;
    if (t->ordered[0] && e->last_passed > t->done_seq[0])
        return 0; /* Order */
    const unsigned char *cid = e->client_id != NULL ? e->client_id : (const unsigned char *)"";
    size_t cid_len = e->client_id_len;
    if (count_of(&self->client_counts, cid, cid_len) + count_of(&self->holds, cid, cid_len) >=
        self->max_per_client)
        return 0;
    const unsigned char *rq = NULL;
    size_t rq_len = 0;
    s0_rkey k;
    k.len = 0;
    k.data = k.inline_buf;
    if (s0p) { /* R10: a key Python holds, the lane holds, or the cache answers is Python's */
        rq = p_msg_data(&f[5]);
        rq_len = p_msg_size(&f[5]);
        if (rkey_make(&k, cid, cid_len, rq, rq_len) < 0)
            return 0;
        uint64_t h = hash_bytes(k.data, k.len);
        if (table_find(&self->pkeys, k.data, k.len, h) != NULL ||
            table_find(&self->lkeys, k.data, k.len, h) != NULL ||
            cache_lookup(&self->cache, k.data, k.len, now) != NULL) {
            rkey_free(&k);
            return 0;
        }
    }
    uint64_t number = ++self->number, seq = ++self->seq; /* (the model's: given, even if passed) */
    long long waits = count_of(&self->waits, svc, svc_len);
    size_t wrid_len = 0;
    const unsigned char *wrid = pool_api->peek(self->pool, svc, svc_len, &wrid_len);
    s0_entry *we = NULL;
    s0_peer *to = NULL; /* forwarded out to this peer ("Forwarding out") */
    s0_link *link = NULL;
    long long deadline_ms = 0;
    if (wrid != NULL) {
        we = entry_find(t, 1, wrid, wrid_len);
        if (waits > 0 || !worker_fits(we, s0p) || wrid_len > 255)
            goto pass;
    } else if (s0p && waits == 0 && self->serve_forwards && self->identity_len > 0 &&
               m->header_len <= 4 /* (no CURVE caller: Python's FORWARD would carry one) */ &&
               ((to = pick_peer(self, svc, svc_len, 1)) != NULL ||
                (pool_api->offered(self->pool, svc, svc_len) <= 0 &&
                 (to = pick_peer(self, svc, svc_len, 0)) != NULL))) {
        link = link_find(self, to->key.data, to->key.len);
        if (link == NULL)
            goto pass; /* (the chosen peer's link is not the lane's) */
        if (to->forward_with) { /* what is left of its deadline, as Python's int() */
            double ms = ((now + self->timeout_s) - now) * 1000.0; /* (deadline - now) */
            if (!json_plain(cid, cid_len) || !(ms < 9.0e18))
                goto pass;
            deadline_ms = ms > 0 ? (long long)ms : 0;
        }
    } else if (!self->may_queue || pool_api->offered(self->pool, svc, svc_len) <= 0 ||
               waits + (long long)wq_count(self, svc, svc_len) >= self->max_queued) {
        goto pass;
    }

    /* Everything that can fail, before the first change. */
    const unsigned char *crid = p_msg_data(&f[0]);
    size_t crid_len = p_msg_size(&f[0]);
    const unsigned char *caller = (const unsigned char *)m->header + 4;
    size_t caller_len = m->header_len - 4;
    size_t n_body = m->n - body_at;
    size_t strings = crid_len + cid_len + caller_len + svc_len + rq_len + (s0p ? k.len : 0) +
                     (to != NULL ? to->key.len : 0);
    unsigned char *p;
    s0_record *r = record_alloc(n_body, strings, &p);
    if (r == NULL)
        goto pass;
    S0_PUT(crid, crid, crid_len);
    S0_PUT(client_id, cid, cid_len);
    S0_PUT(caller, caller, caller_len);
    S0_PUT(service, svc, svc_len);
    S0_PUT(request_id, rq, rq_len);
    if (to != NULL) {
        S0_PUT(peer, to->key.data, to->key.len);
        r->out = 1;
    }
    if (s0p) {
        memcpy(p, k.data, k.len);
        r->ikey.data = p;
        r->ikey.len = k.len;
        r->ikey.hash = hash_bytes(p, k.len);
        r->s0p = r->ids = 1;
    }
    rkey_free(&k);
    for (size_t i = 0; i < n_body; i++) {
        p_msg_init(&r->body[i]);
        if (p_msg_copy(&r->body[i], &f[body_at + i]) != 0) {
            r->n_body = i + 1;
            record_free(r);
            return 0;
        }
    }
    r->n_body = n_body;
    r->started = now;
    r->deadline = now + self->timeout_s;
    r->limit = INFINITY;
    r->reading = reading;
    r->number = number;
    r->seq = seq;
    s0_count *cc = NULL, *rc = NULL, *dc = NULL;
    s0_svc *sv = NULL;
    s0_wq *q = NULL;
    if (heap_reserve(self) < 0 || (s0p && table_reserve(&self->lkeys, 1) < 0) ||
        (cc = count_make(&self->client_counts, cid, cid_len)) == NULL ||
        (rc = count_make(&self->rid_counts, crid, crid_len)) == NULL)
        goto undo;
    if (to != NULL) {
        if (table_reserve(&self->records, 1) < 0 ||
            (dc = delta_make(self, to->key.data, to->key.len, svc, svc_len)) == NULL)
            goto undo;
        unsigned char ticket[255 + 8];
        size_t ticket_len = next_ticket(self, ticket);
        record_set_ticket(r, ticket, ticket_len); /* (fits ticket_buf) */
    } else if (wrid != NULL) {
        if (table_reserve(&self->records, 1) < 0 || (sv = svc_make(self, svc, svc_len)) == NULL)
            goto undo;
        unsigned char ticket[255 + 8];
        size_t ticket_len = next_ticket(self, ticket);
        record_set_ticket(r, ticket, ticket_len); /* (fits ticket_buf) */
        record_set_worker(r, wrid, wrid_len);
        size_t took_len;
        const unsigned char *took = pool_api->take(self->pool, svc, svc_len, &took_len);
        /* (peek named it; nothing changed the pool since: the same worker) */
        if (took == NULL || took_len != wrid_len || memcmp(took, r->wrid, wrid_len) != 0)
            goto undo;
        if (pool_api->hold(self->pool, r->wrid, wrid_len, ticket, ticket_len) != 0) {
            pool_api->list_ready(self->pool, r->wrid, wrid_len); /* back where take found it */
            goto undo;
        }
    } else if ((q = wq_make(self, svc, svc_len)) == NULL) {
        goto undo;
    }
    /* Nothing below fails. */
    heap_push(self, r);
    if (s0p)
        table_insert(&self->lkeys, &r->ikey);
    cc->n++;
    rc->n++;
    self->drain_requests++;
    count(self, ST_REQUESTS, 1);
    heard_add(t, e);
    if (q != NULL) { /* queued: no ticket, no worker, the service not marked changed */
        wq_push(self, q, r);
        count(self, ST_QUEUED, 1);
        return 1;
    }
    if (to != NULL) { /* forwarded out: no worker, no pool slot, the service not changed */
        self->tickets++;
        self->seq++; /* (the ticket's number, next_ticket) */
        table_insert(&self->records, &r->key);
        count_find(&to->free, svc, svc_len)->n--; /* (pick_peer found it) */
        dc->n--;
        delta_settle(self, dc);
        self->drain_forwarded++;
        count(self, ST_FORWARDED, 1);
        if (send_forward(self, r, link->sock, to->forward_with, deadline_ms, &f[body_at],
                         n_body) != 0)
            count(self, ST_SEND_DROPPED, 1); /* the record stays: its deadline hands it over */
        return 1;
    }
    self->tickets++;
    self->seq++; /* (the ticket's number, next_ticket) */
    table_insert(&self->records, &r->key);
    sv->changed = 1;
    if (send_request(self, r, we, &f[body_at], n_body) != 0)
        count(self, ST_SEND_DROPPED, 1); /* the record stays: its deadline hands it to Python */
    return 1;

pass:
    rkey_free(&k);
    return 0;

undo:
    count_settle(&self->client_counts, cc);
    count_settle(&self->rid_counts, rc);
    delta_settle(self, dc);
    record_free(r);
    return 0;
}


/* ---- Forwards: a peer broker's FORWARD served here (phase 4a) ------------------------------ */

/* FORWARDWITH's options, exactly one of the two byte forms Forward.to_frames writes (json,
 * separators (",", ":"), ensure_ascii) that the lane takes: {"deadline_ms":N} or
 * {"deadline_ms":N,"client_id":"C","request_id":"H"}; N 1..2**53 in decimal without a leading
 * zero, C 1..255 bytes of 0x20..0x7e but '"' and '\', H 2..510 lower-case hex digits (an even
 * count). 1: read (*cid_len 0 without ids; else *cid into s and rq the request_id decoded,
 * *rq_len bytes); 0: anything else (Python reads it). */
static int fwd_options(const unsigned char *s, size_t n, long long *deadline_ms,
                       const unsigned char **cid, size_t *cid_len, unsigned char *rq,
                       size_t *rq_len) {
    static const char head[] = "{\"deadline_ms\":";
    static const char mid[] = ",\"client_id\":\"";
    static const char rqs[] = "\",\"request_id\":\"";
    size_t i = sizeof(head) - 1;
    if (n < i || memcmp(s, head, i) != 0)
        return 0;
    size_t at = i;
    uint64_t v = 0;
    while (i < n && i - at < 17 && s[i] >= '0' && s[i] <= '9')
        v = v * 10 + (uint64_t)(s[i++] - '0');
    if (i == at || i - at > 16 || s[at] == '0' || v > (1ULL << 53))
        return 0;
    *deadline_ms = (long long)v;
    *cid_len = *rq_len = 0;
    if (n - i == 1 && s[i] == '}')
        return 1;
    if (n - i < sizeof(mid) - 1 || memcmp(s + i, mid, sizeof(mid) - 1) != 0)
        return 0;
    i += sizeof(mid) - 1;
    at = i;
    while (i < n && s[i] >= 0x20 && s[i] <= 0x7e && s[i] != '"' && s[i] != '\\')
        i++;
    size_t c_len = i - at;
    if (c_len == 0 || c_len > 255)
        return 0;
    const unsigned char *c = s + at;
    if (n - i < sizeof(rqs) - 1 || memcmp(s + i, rqs, sizeof(rqs) - 1) != 0)
        return 0;
    i += sizeof(rqs) - 1;
    at = i;
    while (i < n && ((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
        i++;
    size_t h = i - at;
    if (h < 2 || h > 510 || h % 2 != 0 || n - i != 2 || s[i] != '"' || s[i + 1] != '}')
        return 0;
    for (size_t k = 0; k < h / 2; k++) {
        unsigned char hi = s[at + 2 * k], lo = s[at + 2 * k + 1];
        hi = hi <= '9' ? hi - '0' : hi - 'a' + 10;
        lo = lo <= '9' ? lo - '0' : lo - 'a' + 10;
        rq[k] = (unsigned char)(hi << 4 | lo);
    }
    *cid = c;
    *cid_len = c_len;
    *rq_len = h / 2;
    return 1;
}

/* The take rule for a FORWARD on the peer ROUTER (the mutex held; "Forwards" above): 1 when
 * taken (the worker's REQUEST sent), 0 when it goes to Python (nothing changed but the request
 * and seq counters once it got that far, and an expired reply cache entry of its key dropped). */
static int take_forward(LaneObject *self, s0_message *m, s0_entry *e, double now) {
    s0_sessions *t = &self->sessions;
    if (!self->serving || self->pool == NULL || !self->serve_forwards)
        return 0;
    s0_zmq_msg_t *f = m->frames;
    size_t n = m->n;
    if (n < 7 || !frame_is(&f[1], "", 0) || !frame_is(&f[2], "S0B1", 4))
        return 0;
    int with;
    if (frame_is(&f[3], "FORWARD", 7))
        with = 0;
    else if (n >= 8 && frame_is(&f[3], "FORWARDWITH", 11))
        with = 1;
    else
        return 0; /* (FORWARDAS, a CURVE caller's, is never taken) */
    if (!frames_fit(m, self->max_frame_bytes))
        return 0;
    const unsigned char *ticket = p_msg_data(&f[4]);
    size_t ticket_len = p_msg_size(&f[4]);
    const unsigned char *svc = p_msg_data(&f[5]);
    size_t svc_len = p_msg_size(&f[5]);
    const unsigned char *origin = p_msg_data(&f[6]);
    size_t origin_len = p_msg_size(&f[6]);
    if (ticket_len == 0 || ticket_len > 255 || !service_ok(svc, svc_len) || origin_len == 0 ||
        origin_len > 255)
        return 0;
    for (size_t i = 0; i < origin_len; i++)
        if (origin[i] < 0x20 || origin[i] > 0x7e)
            return 0;
    long long deadline_ms = 0;
    const unsigned char *cid = NULL;
    size_t cid_len = 0, rq_len = 0;
    unsigned char rq[255];
    if (with && !fwd_options(p_msg_data(&f[7]), p_msg_size(&f[7]), &deadline_ms, &cid, &cid_len,
                             rq, &rq_len))
        return 0;
    size_t body_at = with ? 8 : 7;
    if (!e->open || e->client_id == NULL || e->client_id_len == 0)
        return 0;
    if (t->ordered[2] && e->last_passed > t->done_seq[2])
        return 0; /* Order */
    int ids = cid_len > 0;
    s0_rkey k;
    k.len = 0;
    k.data = k.inline_buf;
    if (ids) { /* R10 across brokers: a key Python holds, the lane holds, or the cache answers */
        if (rkey_make(&k, cid, cid_len, rq, rq_len) < 0)
            return 0;
        uint64_t h = hash_bytes(k.data, k.len);
        if (table_find(&self->pkeys, k.data, k.len, h) != NULL ||
            table_find(&self->lkeys, k.data, k.len, h) != NULL ||
            cache_lookup(&self->cache, k.data, k.len, now) != NULL) {
            rkey_free(&k);
            return 0;
        }
    }
    uint64_t number = ++self->number, seq = ++self->seq; /* (as an S0P REQUEST's: given) */
    (void)number;
    size_t wrid_len = 0;
    const unsigned char *wrid = pool_api->peek(self->pool, svc, svc_len, &wrid_len);
    s0_entry *we = wrid != NULL ? entry_find(t, 1, wrid, wrid_len) : NULL;
    long long waits = count_of(&self->waits, svc, svc_len);
    if (wrid != NULL) {
        if (waits > 0 || !worker_fits(we, 1) || wrid_len > 255)
            goto pass;
    } else if (pool_api->offered(self->pool, svc, svc_len) <= 0 ||
               waits + (long long)wq_count(self, svc, svc_len) >= self->max_queued) {
        /* (no worker offers it: Python's 404, F7; R6's cap: Python's 503) */
        goto pass;
    }
    /* No ready worker: queued whatever may_queue says (F6: a FORWARD is never forwarded again,
     * so it may wait in the lane in a family too), behind Python's queue, as a client's. */

    /* Everything that can fail, before the first change. */
    const unsigned char *crid = p_msg_data(&f[0]);
    size_t crid_len = p_msg_size(&f[0]);
    size_t n_body = n - body_at;
    size_t client_len = ids ? cid_len : 1 + e->client_id_len;
    size_t strings =
        crid_len + client_len + svc_len + rq_len + k.len + ticket_len + e->client_id_len;
    unsigned char *p;
    s0_record *r = record_alloc(n_body, strings, &p);
    if (r == NULL)
        goto pass;
    S0_PUT(crid, crid, crid_len);
    if (ids) {
        S0_PUT(client_id, cid, cid_len);
    } else { /* b"\x00" + the peer's broker id: the ledger's key of a forward without ids */
        p[0] = 0;
        memcpy(p + 1, e->client_id, e->client_id_len);
        r->client_id = p;
        r->client_id_len = client_len;
        p += client_len;
    }
    r->caller = p;
    r->caller_len = 0;
    S0_PUT(service, svc, svc_len);
    S0_PUT(request_id, rq, rq_len);
    S0_PUT(origin, ticket, ticket_len);
    S0_PUT(via, e->client_id, e->client_id_len);
    if (ids) {
        memcpy(p, k.data, k.len);
        r->ikey.data = p;
        r->ikey.len = k.len;
        r->ikey.hash = hash_bytes(p, k.len);
    }
    rkey_free(&k);
    r->s0p = r->fwd = 1;
    r->ids = ids;
    for (size_t i = 0; i < n_body; i++) {
        p_msg_init(&r->body[i]);
        if (p_msg_copy(&r->body[i], &f[body_at + i]) != 0) {
            r->n_body = i + 1;
            record_free(r);
            return 0;
        }
    }
    r->n_body = n_body;
    /* Forwarding.forward_in's arithmetic, so the doubles are bit-equal */
    r->started = now;
    if (with) {
        r->limit = now + (double)deadline_ms / 1000.0;
        r->deadline = fmin(now + self->timeout_s, r->limit);
    } else {
        r->limit = INFINITY;
        r->deadline = now + self->timeout_s;
    }
    r->seq = seq;
    s0_svc *sv = NULL;
    s0_wq *q = NULL;
    if (heap_reserve(self) < 0 || (ids && table_reserve(&self->lkeys, 1) < 0) ||
        table_reserve(&self->records, 1) < 0 || (sv = svc_make(self, svc, svc_len)) == NULL ||
        (wrid == NULL && (q = wq_make(self, svc, svc_len)) == NULL)) {
        record_free(r);
        return 0;
    }
    if (q != NULL) { /* queued: no ticket, no worker, the service not marked changed */
        heap_push(self, r);
        if (ids)
            table_insert(&self->lkeys, &r->ikey);
        self->drain_requests++;
        self->drain_forwards++;
        count(self, ST_REQUESTS, 1);
        count(self, ST_FORWARDS, 1);
        count(self, ST_QUEUED, 1);
        heard_add(t, e);
        wq_push(self, q, r);
        return 1;
    }
    unsigned char tk[255 + 8];
    size_t tk_len = next_ticket(self, tk);
    record_set_ticket(r, tk, tk_len); /* (fits ticket_buf) */
    record_set_worker(r, wrid, wrid_len);
    size_t took_len;
    const unsigned char *took = pool_api->take(self->pool, svc, svc_len, &took_len);
    /* (peek named it; nothing changed the pool since: the same worker) */
    if (took == NULL || took_len != wrid_len || memcmp(took, r->wrid, wrid_len) != 0) {
        record_free(r);
        return 0;
    }
    if (pool_api->hold(self->pool, r->wrid, wrid_len, tk, tk_len) != 0) {
        pool_api->list_ready(self->pool, r->wrid, wrid_len); /* back where take found it */
        record_free(r);
        return 0;
    }
    /* Nothing below fails. */
    heap_push(self, r);
    if (ids)
        table_insert(&self->lkeys, &r->ikey);
    self->drain_requests++;
    self->drain_forwards++;
    count(self, ST_REQUESTS, 1);
    count(self, ST_FORWARDS, 1);
    heard_add(t, e);
    self->tickets++;
    self->seq++; /* (the ticket's number, next_ticket) */
    table_insert(&self->records, &r->key);
    sv->changed = 1;
    if (send_request(self, r, we, &f[body_at], n_body) != 0)
        count(self, ST_SEND_DROPPED, 1); /* the record stays: its deadline hands it to Python */
    return 1;

pass:
    rkey_free(&k);
    return 0;
}

#define S0_SERVICES_INLINE 32

/* ---- the RequestDone ring ---------------------------------------------------------------- */

#define S0_DONE_SLOTS 64    /* the ring's first allocation */
#define S0_DONE_KEEP 1024   /* a drained ring keeps its slots up to this many */
#define S0_DONE_LIMIT 65536 /* done_capacity's default */

/* Room for one more record (the mutex held): 1 yes, 0 the ring is full (done_limit records),
 * -1 out of memory (nothing changed). Grows the slots by doubling, never past done_limit. */
static int done_room(LaneObject *self) {
    if (self->done_n >= self->done_limit)
        return 0;
    if (self->done_n < self->done_cap)
        return 1;
    size_t cap = self->done_cap ? self->done_cap * 2 : S0_DONE_SLOTS;
    if (cap > self->done_limit)
        cap = self->done_limit; /* (> done_n: done_n < done_limit) */
    s0_done **slots = malloc(cap * sizeof(*slots));
    if (slots == NULL)
        return -1;
    for (size_t i = 0; i < self->done_n; i++)
        slots[i] = self->done[(self->done_head + i) % self->done_cap];
    free(self->done);
    self->done = slots;
    self->done_cap = cap;
    self->done_head = 0;
    return 1;
}

/* The record of a final REPLY about to be answered (the mutex held, nothing sent yet): the
 * record r, the reply m's body from body_at. NULL: out of memory. */
static s0_done *done_make(const s0_record *r, const s0_message *m, size_t body_at, int status,
                          double now) {
    size_t via_len = r->fwd ? r->via_len : 0;
    size_t strings = r->service_len + r->wrid_len + r->crid_len + via_len;
    s0_done *d = malloc(sizeof(*d) + (strings ? strings : 1));
    if (d == NULL)
        return NULL;
    d->started = r->started;
    d->finished = now;
    d->status = status;
    d->bytes_in = 0;
    for (size_t i = 0; i < r->n_body; i++)
        d->bytes_in += p_msg_size(&r->body[i]);
    d->bytes_out = 0;
    for (size_t i = body_at; i < m->n; i++)
        d->bytes_out += p_msg_size(&m->frames[i]);
    d->service_len = r->service_len;
    d->wrid_len = r->wrid_len;
    d->crid_len = r->crid_len;
    d->via_len = via_len;
    unsigned char *at = d->data;
    if (r->service_len)
        memcpy(at, r->service, r->service_len);
    at += r->service_len;
    if (r->wrid_len)
        memcpy(at, r->wrid, r->wrid_len);
    at += r->wrid_len;
    if (r->crid_len)
        memcpy(at, r->crid, r->crid_len);
    at += r->crid_len;
    if (via_len)
        memcpy(at, r->via, via_len);
    return d;
}

/* Append (the mutex held, after done_room said 1). */
static void done_push(LaneObject *self, s0_done *d) {
    self->done[(self->done_head + self->done_n) % self->done_cap] = d;
    self->done_n++;
}

static void done_free_all(LaneObject *self) {
    for (size_t i = 0; i < self->done_n; i++)
        free(self->done[(self->done_head + i) % self->done_cap]);
    free(self->done);
    self->done = NULL;
    self->done_cap = self->done_head = self->done_n = 0;
}

/* The reply cache's entry for record r's answer (status, the n_body frames of body), under
 * r's key, expiring max_age_s from now: made (the body copied), not committed; NULL out of
 * memory. (The mutex held; before any change, so a failure changes nothing.) */
static s0_cent *reply_entry(LaneObject *self, const s0_record *r, s0_zmq_msg_t *body,
                            size_t n_body, int status, double now) {
    const unsigned char *inline_ptrs[S0_LANE_INLINE_FRAMES] = {NULL};
    size_t inline_sizes[S0_LANE_INLINE_FRAMES] = {0};
    const unsigned char **ptrs = inline_ptrs;
    size_t *sizes = inline_sizes;
    s0_cent *cached = NULL;
    if (n_body > S0_LANE_INLINE_FRAMES) {
        ptrs = malloc(n_body * sizeof(*ptrs));
        sizes = malloc(n_body * sizeof(*sizes));
    }
    if (ptrs != NULL && sizes != NULL) {
        for (size_t i = 0; i < n_body; i++) {
            ptrs[i] = p_msg_data(&body[i]);
            sizes[i] = p_msg_size(&body[i]);
        }
        cached = cache_entry(&self->cache, r->ikey.data, r->ikey.len, r->service, r->service_len,
                             status, n_body, ptrs, sizes, now + self->cache.max_age_s);
    }
    if (ptrs != inline_ptrs)
        free((void *)ptrs);
    if (sizes != inline_sizes)
        free(sizes);
    return cached;
}

/* The take rule for a backend final REPLY, and its answer (the mutex held): 1 when taken (the
 * client's reply is sent, and the worker the head of a lane queue if it got one), 0 when it
 * goes to Python (nothing changed). */
static int take_reply(LaneObject *self, s0_message *m, s0_entry *e, double now) {
    s0_sessions *t = &self->sessions;
    if (!self->serving || self->pool == NULL || self->records.used == 0)
        return 0;
    size_t at; /* the ticket frame */
    int s0p = 0, status = 200;
    if (mdp_worker_reply(m, self->max_frame_bytes, &at)) {
    } else if (s0p_worker_reply(m, self->max_frame_bytes, &status)) {
        s0p = 1;
        at = 4;
    } else {
        return 0;
    }
    size_t body_at = at + 2; /* (after the empty frame, or the status) */
    s0_zmq_msg_t *f = m->frames;
    const unsigned char *ticket = p_msg_data(&f[at]);
    size_t ticket_len = p_msg_size(&f[at]);
    s0_record *r = (s0_record *)table_find(&self->records, ticket, ticket_len,
                                           hash_bytes(ticket, ticket_len));
    if (r == NULL || r->s0p != s0p || r->wrid_len != p_msg_size(&f[0]) ||
        (r->wrid_len && memcmp(r->wrid, p_msg_data(&f[0]), r->wrid_len) != 0))
        return 0; /* (a reply of the other family to a record: Python adopts and answers it) */
    if (!is_negotiated(t, 1, m->fd) || (t->ordered[1] && e->last_passed > t->done_seq[1]))
        return 0;
    /* What the worker serves now (a READY since may have changed it), in its order: one of
     * them waiting in Python is Python's to give it; else the first of the lane's queues that
     * holds a request, if the worker can be written its head (same family, promise_ms 0). */
    const unsigned char *inline_names[S0_SERVICES_INLINE];
    size_t inline_lens[S0_SERVICES_INLINE];
    const unsigned char **names = inline_names;
    size_t *lens = inline_lens;
    size_t n_svc = pool_api->services_of(self->pool, r->wrid, r->wrid_len, names, lens,
                                         S0_SERVICES_INLINE);
    if (n_svc > S0_SERVICES_INLINE) {
        names = malloc(n_svc * sizeof(*names));
        lens = malloc(n_svc * sizeof(*lens));
        if (names == NULL || lens == NULL) {
            if (names != inline_names)
                free((void *)names);
            if (lens != inline_lens)
                free(lens);
            return 0; /* out of memory: Python answers it */
        }
        pool_api->services_of(self->pool, r->wrid, r->wrid_len, names, lens, n_svc);
    }
    s0_wq *q = NULL;
    int pass = 0;
    for (size_t i = 0; i < n_svc && !pass; i++) {
        if (count_of(&self->waits, names[i], lens[i]) > 0)
            pass = 1;
        else if (q == NULL)
            q = wq_find(self, names[i], lens[i]);
    }
    if (names != inline_names) {
        free((void *)names);
        free(lens);
    }
    /* A READY may have lowered the worker's capacity under what it runs: full even once this
     * one is answered, it gets no head (Python's worker_free gives it none either). */
    if (q != NULL && pool_api->spare(self->pool, r->wrid, r->wrid_len) < 0)
        q = NULL;
    if (pass || (q != NULL && !worker_fits(e, q->head->s0p)))
        return 0;
    /* Every check passed: with record_done on, its RequestDone record, made before any change;
     * the ring full, the REPLY goes to Python (which answers and logs it: nothing is lost). */
    s0_done *done = NULL;
    /* (A FORWARD answered 404 or 503 goes back to its origin, which routes it again and
     * records it: no record here, as scale0.core.records.request_done decides.) */
    if (self->record_done && !(r->fwd && (status == 404 || status == 503))) {
        int room = done_room(self);
        if (room == 0) {
            count(self, ST_DONE_FULL, 1);
            return 0;
        }
        if (room < 0 || (done = done_make(r, m, body_at, status, now)) == NULL)
            return 0; /* out of memory: Python answers it */
    }
    s0_svc *sv = svc_make(self, r->service, r->service_len);
    s0_hist *hv = sv != NULL ? hist_make(self, r->service, r->service_len, status) : NULL;
    s0_svc *qsv = NULL;
    s0_record *next = q != NULL ? q->head : NULL;
    if (hv == NULL) {
        free(done);
        return 0; /* out of memory: Python answers it (it adopts the record) */
    }
    s0_cent *cached = NULL; /* an S0P reply's entry in the cache, made before any change */
    if (r->ids) { /* (an S0P client's, or a forwarded one with ids; one without: not cached) */
        cached = reply_entry(self, r, &f[body_at], m->n - body_at, status, now);
        if (cached == NULL) {
            free(done);
            return 0; /* out of memory: Python answers it */
        }
    }
    if (next != NULL) {
        if (table_reserve(&self->records, 1) < 0 ||
            (qsv = svc_make(self, q->key.data, q->key.len)) == NULL)
            goto nomem;
        unsigned char next_ticket_bytes[255 + 8];
        size_t next_len = next_ticket(self, next_ticket_bytes);
        if (pool_api->hold(self->pool, r->wrid, r->wrid_len, next_ticket_bytes, next_len) != 0)
            goto nomem;
        record_set_ticket(next, next_ticket_bytes, next_len); /* (fits ticket_buf) */
    }
    /* Nothing below fails. */
    record_out(self, r);
    pool_api->release(self->pool, r->wrid, r->wrid_len, r->key.data, r->key.len);
    if (next != NULL) { /* the queue's head to this worker at once (its deadline unchanged) */
        wq_unlink(self, next);
        record_set_worker(next, r->wrid, r->wrid_len);
        self->tickets++;
        self->seq++; /* (the ticket's number, next_ticket) */
        table_insert(&self->records, &next->key);
        qsv->changed = 1;
    } else {
        pool_api->list_ready(self->pool, r->wrid, r->wrid_len);
    }
    double latency = now - r->started;
    if (!(latency > 0))
        latency = 0.0;
    hv->counts[bucket_of(latency)]++;
    hv->sum_s += latency;
    hv->observed = 1;
    sv->changed = 1;
    self->drain_replies++;
    count(self, ST_REPLIES, 1);
    if (done != NULL) {
        done_push(self, done);
        count(self, ST_DONE, 1);
    }
    heard_add(t, e);
    if (cached != NULL && cache_commit(&self->cache, cached)) /* (the body copied: sent below) */
        count(self, ST_CACHED, 1);

    const char *head[6];
    size_t head_len[6], n_head = 0;
#define S0_HEAD(data, len)                                                                        \
    do {                                                                                          \
        head[n_head] = (const char *)(data);                                                      \
        head_len[n_head++] = (len);                                                               \
    } while (0)
    void *router = self->ch[0].router;
    if (r->fwd) { /* ForwardReply on the peer ROUTER: [b"", S0B1, FORWARDREPLY, origin, status] */
        router = self->ch[2].router;
        S0_HEAD("", 0);
        S0_HEAD("S0B1", 4);
        S0_HEAD("FORWARDREPLY", 12);
        S0_HEAD(r->origin, r->origin_len);
        S0_HEAD(p_msg_data(&f[at + 1]), 3);
    } else if (s0p) { /* ClientReply: [b"", S0C1, REPLY, service, request_id, status] */
        S0_HEAD("", 0);
        S0_HEAD(SIGNATURES[0], 4);
        S0_HEAD("REPLY", 5);
        S0_HEAD(r->service, r->service_len);
        S0_HEAD(r->request_id, r->request_id_len);
        S0_HEAD(p_msg_data(&f[at + 1]), 3);
    } else { /* MdpClientReply(service, body, protocol, delimited, majortomo) of its reading */
        if (r->reading & READ_DELIMITED)
            S0_HEAD("", 0);
        if (r->reading & READ_V1) {
            S0_HEAD("MDPC01", 6);
        } else {
            S0_HEAD("MDPC02", 6);
            S0_HEAD((r->reading & READ_MAJORTOMO) ? "\x04" : "\x03", 1);
        }
        if (!(r->reading & READ_MAJORTOMO)) /* majortomo's reply has no service frame */
            S0_HEAD(r->service, r->service_len);
    }
#undef S0_HEAD
    int err = send_message(router, r->crid, r->crid_len, head, head_len, n_head, &f[body_at],
                           m->n - body_at);
    if (err != 0)
        count(self, ST_SEND_DROPPED, 1);
    record_free(r);
    if (next != NULL) { /* then the worker's REQUEST: copies of the body the record keeps */
        s0_zmq_msg_t inline_body[S0_LANE_INLINE_FRAMES];
        s0_zmq_msg_t *body = inline_body;
        size_t n = next->n_body, made = 0;
        if (n > S0_LANE_INLINE_FRAMES && (body = malloc(n * sizeof(*body))) == NULL)
            n = 0;
        for (; made < n; made++) {
            p_msg_init(&body[made]);
            if (p_msg_copy(&body[made], &next->body[made]) != 0) {
                p_msg_close(&body[made]);
                break;
            }
        }
        if (body == NULL || made < next->n_body ||
            send_request(self, next, e, body, made) != 0)
            count(self, ST_SEND_DROPPED, 1); /* the record stays: its deadline hands it over */
        for (size_t i = 0; i < made; i++)
            p_msg_close(&body[i]); /* (sent ones are empty now) */
        if (body != inline_body)
            free(body);
    }
    return 1;

nomem:
    free(cached);
    free(done);
    return 0;
}

/* Take the message or number it for Python (the mutex held). */
static void classify(LaneObject *self, int channel, s0_message *m, double now, double wall) {
    s0_sessions *t = &self->sessions;
    s0_zmq_msg_t *rid = &m->frames[0];
    s0_entry *e = entry_find(t, channel, p_msg_data(rid), p_msg_size(rid));
    if (e != NULL && takes(self, channel, m, e, now, wall)) {
        m->take = TAKE_BEAT;
        m->promise = e->promise_ms;
        heard_add(t, e);
        return;
    }
    if (e != NULL && channel == 2) {
        if (take_forward(self, m, e, now)) {
            m->take = TAKE_FORWARD;
            return;
        }
    } else if (e != NULL &&
               (channel == 0 ? take_request(self, m, e, now) : take_reply(self, m, e, now))) {
        m->take = channel == 0 ? TAKE_REQUEST : TAKE_REPLY;
        return;
    }
    uint64_t seq = ++t->passed_seq[channel];
    if (e != NULL)
        e->last_passed = seq;
}

/* `wall` as JSON's float, as Python's repr writes it: the shortest of %.15g..%.17g that reads
 * back as it (the thread runs in the C locale), with a "." when it has neither "." nor exponent.
 * number: at least 40 bytes. */
static void format_time(char *number, size_t size, double wall) {
    for (int precision = 15; precision <= 17; precision++) {
        snprintf(number, size, "%.*g", precision, wall);
        if (strtod(number, NULL) == wall)
            break;
    }
    if (strpbrk(number, ".eEn") == NULL)
        strcat(number, ".0");
}

/* The frontend's answer to a beat taken (Heartbeat.to_frames' bytes); `number` its time. */
static void answer(LaneObject *self, s0_message *m, const char *number, long long version) {
    char opts[160];
    int len;
    if (m->promise > 0)
        len = snprintf(opts, sizeof(opts),
                       "{\"time\":%s,\"config_version\":%lld,\"interval_ms\":%lld}", number,
                       version, m->promise);
    else
        len = snprintf(opts, sizeof(opts), "{\"time\":%s,\"config_version\":%lld}", number,
                       version);
    void *router = self->ch[0].router;
    s0_zmq_msg_t *rid = &m->frames[0];
    int flags = S0_ZMQ_DONTWAIT | S0_ZMQ_SNDMORE;
    int err = send_frame(router, p_msg_data(rid), p_msg_size(rid), flags);
    if (err == 0)
        err = send_frame(router, "", 0, flags);
    if (err == 0)
        err = send_frame(router, SIGNATURES[0], 4, flags);
    if (err == 0)
        err = send_frame(router, "HEARTBEAT", 9, flags);
    if (err == 0)
        err = send_frame(router, opts, (size_t)len, S0_ZMQ_DONTWAIT);
    count(self, err == 0 ? ST_ANSWERS : ST_SEND_DROPPED, 1);
}

/* Send the held and new messages of `c` to its pipe, in order, until it is full. 1: all gone. */
static int deliver(LaneObject *self, s0_channel *c) {
    while (c->cursor < c->count) {
        s0_message *m = &c->batch[c->cursor];
        int err = send_frame(c->pipe, m->header, m->header_len,
                             S0_ZMQ_DONTWAIT | S0_ZMQ_SNDMORE);
        if (err == EAGAIN) {
            count(self, ST_STALLED, 1);
            return 0;
        }
        if (err == 0 && m->lid_len) /* channel 3: the link's id, as a ROUTER's routing id */
            err = send_frame(c->pipe, m->header + m->header_len, m->lid_len,
                             S0_ZMQ_DONTWAIT | (m->n ? S0_ZMQ_SNDMORE : 0));
        for (size_t i = 0; err == 0 && i < m->n; i++) {
            int flags = S0_ZMQ_DONTWAIT | (i + 1 < m->n ? S0_ZMQ_SNDMORE : 0);
            for (;;) {
                if (p_msg_send(&m->frames[i], c->pipe, flags) >= 0)
                    break;
                err = p_errno();
                if (err != EINTR)
                    break;
                err = 0;
            }
        }
        /* a pipe that took the first frame takes the rest; a failure is its end (ETERM) */
        count(self, err == 0 ? ST_PASSED : ST_LOST, 1);
        message_close(m);
        c->cursor++;
    }
    c->count = c->cursor = 0;
    return 1;
}

/* Put the link's id in m's header buffer after the header (channel 3). 0, or -1 out of
 * memory. */
static int message_set_lid(s0_message *m, const unsigned char *id, size_t len) {
    size_t need = m->header_len + len;
    if (need > sizeof(m->inline_header) && m->header == m->inline_header) {
        char *h = malloc(need);
        if (h == NULL)
            return -1;
        memcpy(h, m->header, m->header_len);
        m->header = h;
    }
    memcpy(m->header + m->header_len, id, len);
    m->lid_len = len;
    return 0;
}

/* The take rule for a FORWARDREPLY on a link (the mutex held; "Forwarding out"): m is what the
 * link DEALER received, [b"", S0B1, FORWARDREPLY, ticket, status, body..]. 1 when taken (the
 * client's REPLY sent), 0 when it goes to Python (nothing changed). */
static int take_link_reply(LaneObject *self, s0_message *m, s0_link *link, double now) {
    s0_sessions *t = &self->sessions;
    if (!self->serving || self->records.used == 0)
        return 0;
    s0_zmq_msg_t *f = m->frames;
    size_t n = m->n;
    if (n < 5 || !frame_is(&f[0], "", 0) || !frame_is(&f[1], "S0B1", 4) ||
        !frame_is(&f[2], "FORWARDREPLY", 12))
        return 0;
    for (size_t i = 0; i < n; i++)
        if (p_msg_size(&f[i]) > (size_t)self->max_frame_bytes)
            return 0;
    const unsigned char *ticket = p_msg_data(&f[3]);
    size_t ticket_len = p_msg_size(&f[3]);
    if (ticket_len == 0 || ticket_len > 255 || p_msg_size(&f[4]) != 3)
        return 0;
    const unsigned char *d = p_msg_data(&f[4]);
    if (d[0] < '1' || d[0] > '5' || d[1] < '0' || d[1] > '9' || d[2] < '0' || d[2] > '9')
        return 0;
    int status = (d[0] - '0') * 100 + (d[1] - '0') * 10 + (d[2] - '0');
    if (status == 404 || status == 503)
        return 0; /* F8: Python adopts it and routes it again */
    s0_record *r = (s0_record *)table_find(&self->records, ticket, ticket_len,
                                           hash_bytes(ticket, ticket_len));
    if (r == NULL || !r->out || r->peer_len != link->id_len ||
        memcmp(r->peer, link->id, link->id_len) != 0)
        return 0; /* (unknown, or another link's) */
    if (count_of(&self->waits, r->service, r->service_len) > 0 ||
        wq_count(self, r->service, r->service_len) > 0)
        return 0; /* F9: something of it waits (Python's, or the lane's peers' FORWARDs):
                   * Python's drain_to_peers goes first */
    if (t->ordered[S0_LINKS] && link->last_passed > t->done_seq[S0_LINKS])
        return 0; /* Order */
    /* Everything that can fail, before any change. */
    s0_hist *hv = hist_make(self, r->service, r->service_len, status);
    s0_count *dc = hv != NULL ? delta_make(self, r->peer, r->peer_len, r->service,
                                           r->service_len)
                              : NULL;
    if (dc == NULL)
        return 0;
    size_t body_at = 5, n_body = n - body_at;
    s0_cent *cached = NULL;
    if (r->ids) {
        cached = reply_entry(self, r, &f[body_at], n_body, status, now);
        if (cached == NULL) {
            delta_settle(self, dc);
            return 0; /* out of memory: Python answers it */
        }
    }
    /* Nothing below fails. */
    record_out(self, r);
    if (now > link->last_seen) /* (heard: Python hears the peer then, F3) */
        link->last_seen = now;
    link->heard = 1;
    s0_peer *p = peer_find(self, r->peer, r->peer_len, NULL);
    s0_count *fc = p != NULL ? count_find(&p->free, r->service, r->service_len) : NULL;
    if (fc != NULL)
        fc->n++;
    dc->n++;
    delta_settle(self, dc);
    double latency = now - r->started;
    if (!(latency > 0))
        latency = 0.0;
    hv->counts[bucket_of(latency)]++;
    hv->sum_s += latency;
    hv->observed = 1;
    self->drain_replies++;
    count(self, ST_REPLIES, 1);
    if (cached != NULL && cache_commit(&self->cache, cached)) /* (the body copied: sent below) */
        count(self, ST_CACHED, 1);
    const char *head[6] = {"", SIGNATURES[0], "REPLY", (const char *)r->service,
                           (const char *)r->request_id, (const char *)d};
    size_t head_len[6] = {0, 4, 5, r->service_len, r->request_id_len, 3};
    if (send_message(self->ch[0].router, r->crid, r->crid_len, head, head_len, 6, &f[body_at],
                     n_body) != 0)
        count(self, ST_SEND_DROPPED, 1);
    record_free(r);
    return 1;
}

/* Read up to a budget of messages from `sock` (channel's ROUTER, or on channel 3 the link
 * `link`'s DEALER), take what the rule takes, pass the rest. 1: all of it went to the pipe. */
static int read_socket(LaneObject *self, int channel, void *sock, s0_link *link) {
    s0_channel *c = &self->ch[channel];
    size_t n = 0;
    int err = 0;
    while (n < S0_LANE_BUDGET) {
        int rc = receive_message(sock, &c->batch[n], c->keyed, &err);
        if (rc == 0)
            break;
        if (rc < 0) {
            if (err != ENOMEM) {
                count(self, ST_ERRORS, 1);
                break;
            }
            count(self, ST_RECEIVED, 1); /* received and lost (out of memory) */
            count(self, ST_LOST, 1);
            continue;
        }
        if (link != NULL && message_set_lid(&c->batch[n], link->id, link->id_len) < 0) {
            message_close(&c->batch[n]);
            count(self, ST_RECEIVED, 1);
            count(self, ST_LOST, 1);
            continue;
        }
        n++;
    }
    if (n == 0)
        return 1;
    count(self, ST_RECEIVED, n);
    double now = clock_of(CLOCK_MONOTONIC);
    double wall = clock_of(CLOCK_REALTIME);
    pthread_mutex_lock(&self->mutex);
    for (size_t i = 0; i < n; i++) {
        if (link == NULL) {
            classify(self, channel, &c->batch[i], now, wall);
        } else if (take_link_reply(self, &c->batch[i], link, now)) {
            c->batch[i].take = TAKE_REPLY;
        } else {
            link->last_passed = ++self->sessions.passed_seq[S0_LINKS];
        }
    }
    long long version = self->sessions.config_version;
    pthread_mutex_unlock(&self->mutex);
    size_t kept = 0;
    uint64_t beats = 0;
    char number[40] = ""; /* the answers' time, made once per batch */
    for (size_t i = 0; i < n; i++) {
        s0_message *m = &c->batch[i];
        if (m->take) {
            if (m->take != TAKE_BEAT) { /* a REQUEST or REPLY: sent on under the lock */
                message_close(m);
                continue;
            }
            beats++;
            if (channel == 0) {
                if (number[0] == '\0')
                    format_time(number, sizeof(number), wall);
                answer(self, m, number, version);
            }
            message_close(m);
            continue;
        }
        if (kept != i) { /* move it down: its frames are plain bytes (zmq_msg_t is movable) */
            s0_message *to = &c->batch[kept];
            *to = *m;
            if (m->frames == m->inline_frames)
                to->frames = to->inline_frames;
            if (m->header == m->inline_header)
                to->header = to->inline_header;
            m->frames = m->inline_frames;
            m->cap = S0_LANE_INLINE_FRAMES;
            m->n = 0;
            m->header = m->inline_header;
            m->lid_len = 0;
        }
        kept++;
    }
    count(self, ST_BEATS, beats);
    c->count = kept;
    c->cursor = 0;
    return deliver(self, c);
}

/* The link of this id in the thread's snapshot, NULL if none. */
static s0_link *snap_find(const LaneObject *self, const void *id, size_t len) {
    for (size_t i = 0; i < self->n_snap; i++) {
        s0_link *l = self->snap[i];
        if (l->id_len == len && memcmp(l->id, id, len) == 0)
            return l;
    }
    return NULL;
}

/* Forward Python's sends on channel k's pipe to its ROUTER (on channel 3: [link_id, frames..]
 * to that link's DEALER as frames..): at most `budget` messages (0: all). A message of one
 * 8-byte frame is Python's "done" mark (see "Order"), not a send. */
static void forward(LaneObject *self, int k, size_t budget) {
    s0_channel *c = &self->ch[k];
    for (size_t done = 0; budget == 0 || done < budget; done++) {
        int more = 1, first = 1, failed = 0, mark = 0, sent = 0;
        void *dest = c->router;
        while (more) {
            s0_zmq_msg_t f;
            p_msg_init(&f);
            int err = recv_frame(c->pipe, &f);
            if (err != 0) {
                p_msg_close(&f);
                if (!(err == EAGAIN && first))
                    count(self, ST_ERRORS, 1);
                return;
            }
            more = p_msg_more(&f);
            if (first && !more && p_msg_size(&f) == 8) {
                const unsigned char *b = p_msg_data(&f);
                uint64_t seq = 0;
                for (int i = 7; i >= 0; i--)
                    seq = (seq << 8) | b[i];
                s0_sessions *t = &self->sessions;
                if (seq > t->done_seq[k])
                    t->done_seq[k] = seq;
                t->ordered[k] = 1;
                mark = 1;
                p_msg_close(&f);
                break;
            }
            if (first && k == S0_LINKS) { /* the link's id: where the rest goes, not sent */
                s0_link *l = snap_find(self, p_msg_data(&f), p_msg_size(&f));
                dest = l != NULL ? l->sock : NULL;
                if (dest == NULL || !more)
                    failed = 1;
                first = 0;
                p_msg_close(&f);
                continue;
            }
            first = 0;
            if (!failed) {
                int flags = S0_ZMQ_DONTWAIT | (more ? S0_ZMQ_SNDMORE : 0);
                for (;;) {
                    if (p_msg_send(&f, dest, flags) >= 0) {
                        sent = 1;
                        break;
                    }
                    if (p_errno() != EINTR) {
                        failed = 1;
                        break;
                    }
                }
                /* (a DEALER refusing a later frame after taking the first: libzmq sends the
                 * message whole or not at all; the rest is read and dropped) */
            }
            p_msg_close(&f);
        }
        (void)sent;
        count(self, mark ? ST_MARKS : failed ? ST_SEND_DROPPED : ST_SENT, 1);
    }
}

/* The thread's copy of the link set (the mutex held): 1 if one of them is being removed, -1 out
 * of memory (the old copy kept). */
static int snap_take(LaneObject *self) {
    if (self->n_links > self->snap_cap) {
        size_t cap = self->snap_cap ? self->snap_cap : 8;
        while (cap < self->n_links)
            cap *= 2;
        s0_link **grown = realloc(self->snap, cap * sizeof(*grown));
        if (grown == NULL)
            return -1;
        self->snap = grown;
        self->snap_cap = cap;
    }
    int removing = 0;
    for (size_t i = 0; i < self->n_links; i++) {
        self->snap[i] = self->link_set[i];
        removing |= self->link_set[i]->removing;
    }
    self->n_snap = self->n_links;
    return removing;
}

/* Let go of the links being removed (the mutex held): out of the set, into `gone` for
 * released_links() (out of memory: kept for the next wake-up). Then a new snapshot. */
static void links_release(LaneObject *self) {
    size_t kept = 0;
    for (size_t i = 0; i < self->n_links; i++) {
        s0_link *l = self->link_set[i];
        if (l->removing && self->n_gone == self->gone_cap) {
            size_t cap = self->gone_cap ? 2 * self->gone_cap : 8;
            s0_link **grown = realloc(self->gone, cap * sizeof(*grown));
            if (grown != NULL) {
                self->gone = grown;
                self->gone_cap = cap;
            }
        }
        if (l->removing && self->n_gone < self->gone_cap)
            self->gone[self->n_gone++] = l;
        else
            self->link_set[kept++] = l;
    }
    self->n_links = kept;
    snap_take(self);
}

/* Whether the lane has channel k. */
static int has_channel(const LaneObject *self, int k) {
    return k < self->n_ch || (k == S0_LINKS && self->links);
}

static void *lane_main(void *arg) {
    LaneObject *self = arg;
    locale_t c_locale = newlocale(LC_ALL_MASK, "C", (locale_t)0);
    locale_t previous = c_locale ? uselocale(c_locale) : (locale_t)0;
    int pipe_at[S0_CHANNELS], router_at[S0_CHANNELS];
    pthread_mutex_lock(&self->mutex);
    snap_take(self);
    pthread_mutex_unlock(&self->mutex);
    for (;;) {
        size_t need = 2 * S0_CHANNELS + 1 + self->n_snap;
        if (need > self->items_cap) {
            s0_zmq_pollitem_t *grown = realloc(self->items, need * sizeof(*grown));
            if (grown != NULL) {
                self->items = grown;
                self->items_cap = need;
            }
        }
        s0_zmq_pollitem_t *items = self->items;
        int n = 0;
        for (int k = 0; k < S0_CHANNELS; k++) {
            router_at[k] = pipe_at[k] = -1;
            if (!has_channel(self, k))
                continue;
            s0_channel *c = &self->ch[k];
            int held = c->cursor < c->count;
            if (c->router != NULL) {
                router_at[k] = n;
                items[n++] = (s0_zmq_pollitem_t){c->router, 0, held ? 0 : S0_ZMQ_POLLIN, 0};
            }
            pipe_at[k] = n;
            items[n++] = (s0_zmq_pollitem_t){
                c->pipe, 0, (short)(S0_ZMQ_POLLIN | (held ? S0_ZMQ_POLLOUT : 0)), 0};
        }
        int wake_at = n;
        items[n++] = (s0_zmq_pollitem_t){NULL, self->wake_fd, S0_ZMQ_POLLIN, 0};
        if (self->links && self->items_cap >= (size_t)n + self->n_snap) {
            /* (out of memory for the items: the links are still read at every wake-up) */
            int held = self->ch[S0_LINKS].cursor < self->ch[S0_LINKS].count;
            for (size_t i = 0; i < self->n_snap; i++)
                items[n++] = (s0_zmq_pollitem_t){self->snap[i]->sock, 0,
                                                 held ? 0 : S0_ZMQ_POLLIN, 0};
        }
        int rc = p_poll(items, n, -1);
        if (rc < 0) {
            int err = p_errno();
            if (err == EINTR)
                continue;
            count(self, ST_ERRORS, 1);
            break; /* ETERM, or a socket closed under us */
        }
        count(self, ST_WAKEUPS, 1);
        if (__atomic_load_n(&self->stop_flag, __ATOMIC_ACQUIRE))
            break;
        if (items[wake_at].revents & S0_ZMQ_POLLIN) { /* add_link / remove_link */
            uint64_t value;
            ssize_t got = read(self->wake_fd, &value, sizeof(value));
            (void)got;
        }
        int removing = 0;
        if (self->links) {
            pthread_mutex_lock(&self->mutex);
            removing = snap_take(self) == 1;
            pthread_mutex_unlock(&self->mutex);
        }
        for (int k = 0; k < S0_CHANNELS; k++)
            if (pipe_at[k] >= 0 && (items[pipe_at[k]].revents & S0_ZMQ_POLLIN ||
                                    (k == S0_LINKS && removing)))
                forward(self, k, k == S0_LINKS && removing ? 0 : S0_LANE_BUDGET);
        if (removing) { /* after what Python wrote before remove_link: the pipe was read first */
            pthread_mutex_lock(&self->mutex);
            links_release(self);
            pthread_mutex_unlock(&self->mutex);
        }
        for (int k = 0; k < S0_CHANNELS; k++) {
            if (!has_channel(self, k))
                continue;
            s0_channel *c = &self->ch[k];
            if (c->cursor < c->count && !deliver(self, c))
                continue;
            if (k == S0_LINKS) {
                for (size_t i = 0; i < self->n_snap; i++)
                    if (!read_socket(self, k, self->snap[i]->sock, self->snap[i]))
                        break; /* the pipe is full: the rest wait */
            } else if (items[router_at[k]].revents & S0_ZMQ_POLLIN ||
                       items[router_at[k]].events == 0) {
                read_socket(self, k, c->router, NULL);
            }
        }
    }
    /* Python's last sends (its DISCONNECTs at shutdown), all of them. */
    if (self->links) {
        pthread_mutex_lock(&self->mutex);
        snap_take(self);
        pthread_mutex_unlock(&self->mutex);
    }
    for (int k = 0; k < S0_CHANNELS; k++)
        if (has_channel(self, k))
            forward(self, k, 0);
    if (self->links) {
        pthread_mutex_lock(&self->mutex);
        links_release(self);
        pthread_mutex_unlock(&self->mutex);
    }
    /* held for a full pipe: what it takes now, the rest is lost */
    for (int k = 0; k < S0_CHANNELS; k++) {
        s0_channel *c = &self->ch[k];
        if (has_channel(self, k) && c->cursor < c->count && !deliver(self, c)) {
            count(self, ST_LOST, c->count - c->cursor);
            for (size_t i = c->cursor; i < c->count; i++)
                message_close(&c->batch[i]);
            c->count = c->cursor = 0;
        }
    }
    if (c_locale) {
        uselocale(previous);
        freelocale(c_locale);
    }
    return NULL;
}

/* ---- Python methods ------------------------------------------------------------------------ */

/* Take the lane's lock from Python (the GIL held): at once if free (or ours: it is recursive),
 * else the GIL released while waiting, so the thread holding it (Python's or the lane's) is
 * never stuck behind the GIL. */
static void py_lock(LaneObject *self) {
    if (pthread_mutex_trylock(&self->mutex) == 0)
        return;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->mutex);
    Py_END_ALLOW_THREADS
}

static int parse_channel(const LaneObject *self, int channel) {
    if (channel < 0 || channel >= self->n_ch) {
        if (self->n_ch == 3)
            PyErr_Format(PyExc_ValueError,
                         "channel must be 0 (frontend), 1 (backend) or 2 (peer), not %d", channel);
        else
            PyErr_Format(PyExc_ValueError,
                         "channel must be 0 (frontend) or 1 (backend), not %d (2, the peer "
                         "ROUTER, only for a lane made with peer and peer_pipe)",
                         channel);
        return -1;
    }
    return 0;
}

static void *handle_of(PyObject *obj, const char *name) {
    void *handle = PyLong_Check(obj) ? PyLong_AsVoidPtr(obj) : NULL;
    if (handle == NULL) {
        if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_OverflowError) ||
            PyErr_ExceptionMatches(PyExc_TypeError)) {
            PyErr_Clear();
            PyErr_Format(PyExc_TypeError,
                         "Lane: %s must be a libzmq socket handle (pyzmq Socket.underlying), "
                         "not %.100R",
                         name, obj);
        }
    }
    return handle;
}

static PyObject *lane_new(PyTypeObject *type, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"frontend",   "backend", "front_pipe", "back_pipe",
                             "keyed_front", "keyed_back", "max_frame_bytes", "peer",
                             "peer_pipe",  "keyed_peer", "link_pipe", NULL};
    PyObject *handles[7] = {NULL, NULL, NULL, NULL, Py_None, Py_None, Py_None};
    int keyed_front, keyed_back, keyed_peer = 0;
    Py_ssize_t max_frame_bytes;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OOOOppn|OOpO:Lane", kwlist, &handles[0],
                                     &handles[1], &handles[2], &handles[3], &keyed_front,
                                     &keyed_back, &max_frame_bytes, &handles[4], &handles[5],
                                     &keyed_peer, &handles[6]))
        return NULL;
    if ((handles[4] == Py_None) != (handles[5] == Py_None)) {
        PyErr_SetString(PyExc_ValueError,
                        handles[4] == Py_None
                            ? "Lane: peer_pipe given without peer (give both, or neither)"
                            : "Lane: peer given without peer_pipe (give both, or neither)");
        return NULL;
    }
    int n_ch = handles[4] == Py_None ? 2 : 3;
    int links = handles[6] != Py_None;
    if (links && n_ch < 3) {
        PyErr_SetString(PyExc_ValueError,
                        "Lane: link_pipe given without peer and peer_pipe (the links are a "
                        "family's: give the peer ROUTER too)");
        return NULL;
    }
    static const char *names[7] = {"frontend", "backend", "front_pipe", "back_pipe", "peer",
                                   "peer_pipe", "link_pipe"};
    void *socks[7] = {NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    for (int i = 0; i < 2 * n_ch + links; i++) {
        socks[i] = handle_of(handles[i], names[i]);
        if (socks[i] == NULL)
            return NULL;
    }
    if (max_frame_bytes < 0) {
        PyErr_Format(PyExc_ValueError, "Lane: max_frame_bytes must be >= 0, not %zd",
                     max_frame_bytes);
        return NULL;
    }
    LaneObject *self = (LaneObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    /* tp_alloc zeroed it */
    self->wake_fd = -1;
    self->n_ch = n_ch;
    self->links = links;
    for (int k = 0; k < S0_CHANNELS; k++) { /* (every batch set up: dealloc closes them) */
        s0_channel *c = &self->ch[k];
        static const int router_at[S0_CHANNELS] = {0, 1, 4, -1},
                         pipe_at[S0_CHANNELS] = {2, 3, 5, 6};
        c->router = router_at[k] >= 0 ? socks[router_at[k]] : NULL; /* (links: no ROUTER) */
        c->pipe = socks[pipe_at[k]];
        c->keyed = k == 0 ? keyed_front : k == 1 ? keyed_back : k == 2 ? keyed_peer : 0;
        for (size_t i = 0; i < S0_LANE_BUDGET; i++) {
            c->batch[i].frames = c->batch[i].inline_frames;
            c->batch[i].cap = S0_LANE_INLINE_FRAMES;
            c->batch[i].header = c->batch[i].inline_header;
        }
    }
    self->max_frame_bytes = max_frame_bytes;
    /* scale0.core.ledger's REPLY_CACHE_ENTRIES, REPLY_CACHE_BYTES, REPLY_CACHE_AGE_S */
    self->cache.max_entries = 10000;
    self->cache.max_bytes = 64LL << 20;
    self->cache.max_age_s = 60.0;
    self->done_limit = S0_DONE_LIMIT;
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_RECURSIVE);
    pthread_mutex_init(&self->mutex, &attr);
    pthread_mutexattr_destroy(&attr);
    pthread_mutex_init(&self->join_mutex, NULL);
    self->items_cap = 2 * S0_CHANNELS + 1 + 8; /* (the thread grows it with the links) */
    self->items = malloc(self->items_cap * sizeof(*self->items));
    if (self->items == NULL) {
        Py_DECREF(self);
        return PyErr_NoMemory();
    }
    self->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (self->wake_fd < 0) {
        PyErr_SetFromErrno(PyExc_OSError);
        Py_DECREF(self);
        return NULL;
    }
    return (PyObject *)self;
}

/* Stop and join the thread (if it runs), the GIL released; when two Python threads call stop()
 * at once, the second returns once the first has joined. */
static void lane_join(LaneObject *self) {
    if (!self->started)
        return;
    Py_BEGIN_ALLOW_THREADS
    pthread_mutex_lock(&self->join_mutex);
    if (!self->joined) {
        __atomic_store_n(&self->stop_flag, 1, __ATOMIC_RELEASE);
        uint64_t one = 1;
        ssize_t w = write(self->wake_fd, &one, sizeof(one));
        (void)w; /* EAGAIN: the counter is already set, the thread wakes anyway */
        pthread_join(self->thread, NULL);
        self->joined = 1;
    }
    pthread_mutex_unlock(&self->join_mutex);
    Py_END_ALLOW_THREADS
}

static void records_free(LaneObject *self) {
    for (size_t i = 0; i < self->n_heap; i++)
        record_free(self->heap[i]);
    free(self->heap);
    self->heap = NULL;
    self->n_heap = self->heap_cap = 0;
    free(self->records.slots); /* (its records were the heap's) */
    memset(&self->records, 0, sizeof(self->records));
}

static void lane_dealloc(LaneObject *self) {
    /* A lane dropped inside lock(): release this thread's holds, or the join would wait on it */
    while (self->python_holds > 0 && pthread_mutex_unlock(&self->mutex) == 0)
        self->python_holds--;
    lane_join(self);
    if (self->pool != NULL)
        pool_api->set_guard(self->pool, NULL);
    self->pool = NULL;
    Py_CLEAR(self->pool_obj);
    records_free(self);
    table_free_all(&self->waits);
    table_free_all(&self->holds);
    table_free_all(&self->client_counts);
    table_free_all(&self->rid_counts);
    table_free_all(&self->svcs);
    table_free_all(&self->hists);
    table_free_all(&self->wqueues); /* (their records were the heap's) */
    free(self->lkeys.slots);        /* (its keys were in the heap's records) */
    table_free_all(&self->pkeys);
    cache_free(&self->cache);
    done_free_all(self);
    for (size_t i = 0; i < self->n_links; i++)
        free(self->link_set[i]); /* (the sockets are Python's) */
    free(self->link_set);
    for (size_t i = 0; i < self->n_gone; i++)
        free(self->gone[i]);
    free(self->gone);
    for (size_t i = 0; i < self->n_peers; i++)
        peer_free(self->peers[i]);
    free(self->peers);
    table_free_all(&self->deltas);
    free(self->snap);
    free(self->items);
    if (self->wake_fd >= 0)
        close(self->wake_fd);
    for (int k = 0; k < S0_CHANNELS; k++)
        for (size_t i = 0; i < S0_LANE_BUDGET; i++)
            message_close(&self->ch[k].batch[i]);
    sessions_free(&self->sessions);
    pthread_mutex_destroy(&self->mutex);
    pthread_mutex_destroy(&self->join_mutex);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *lane_start(LaneObject *self, PyObject *unused) {
    (void)unused;
    if (self->started || self->stopped) {
        PyErr_SetString(PyExc_RuntimeError,
                        self->stopped ? "Lane.start: the lane was stopped; make a new one"
                                      : "Lane.start: already started");
        return NULL;
    }
    /* Signals go to Python's threads, never to the lane's (its poll would only see EINTR). */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);
    int rc = pthread_create(&self->thread, NULL, lane_main, self);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    self->started = 1;
    Py_RETURN_NONE;
}

static PyObject *lane_stop(LaneObject *self, PyObject *unused) {
    (void)unused;
    if (self->python_holds > 0) {
        PyErr_SetString(PyExc_RuntimeError,
                        "Lane.stop: Python holds the lane's lock (lock() without unlock()); the "
                        "thread may be waiting for it, so joining it would deadlock");
        return NULL;
    }
    self->stopped = 1;
    lane_join(self);
    Py_RETURN_NONE;
}

static PyObject *lane_configure(LaneObject *self, PyObject *args) {
    long long version;
    double skew;
    if (!PyArg_ParseTuple(args, "Ld:configure", &version, &skew))
        return NULL;
    if (isnan(skew) || skew < 0) {
        PyErr_Format(PyExc_ValueError, "Lane.configure: max_skew_s must be >= 0, not %R",
                     PyTuple_GET_ITEM(args, 1));
        return NULL;
    }
    py_lock(self);
    self->sessions.configured = 1;
    self->sessions.config_version = version;
    self->sessions.max_skew_s = skew;
    pthread_mutex_unlock(&self->mutex);
    Py_RETURN_NONE;
}

static PyObject *lane_note(LaneObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"channel",   "routing_id", "promise_ms", "gap_s", "last_seen",
                             "majordomo", "client_id",  "open",       NULL};
    int channel;
    const char *rid;
    Py_ssize_t rid_len;
    long long promise;
    double gap, last_seen;
    int majordomo = 0, open = 1;
    const char *cid = "";
    Py_ssize_t cid_len = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iy#Ldd|iy#p:note", kwlist, &channel, &rid,
                                     &rid_len, &promise, &gap, &last_seen, &majordomo, &cid,
                                     &cid_len, &open) ||
        parse_channel(self, channel) < 0)
        return NULL;
    if (majordomo < 0 || majordomo > 15) {
        PyErr_Format(PyExc_ValueError,
                     "Lane.note: majordomo must be 0 (S0P) or a Majordomo reading packed in 4 "
                     "bits (1..15), not %d",
                     majordomo);
        return NULL;
    }
    if (channel == 2 && (cid_len < 1 || cid_len > 255 ||
                         !utf8_valid((const unsigned char *)cid, (size_t)cid_len))) {
        PyErr_Format(PyExc_ValueError,
                     "Lane.note: a peer's client_id (its broker_id) must be 1..255 bytes of "
                     "UTF-8, not %zd bytes%s",
                     cid_len, cid_len >= 1 && cid_len <= 255 ? " that are not UTF-8" : "");
        return NULL;
    }
    if (isnan(gap) || gap < 0) {
        PyErr_Format(PyExc_ValueError, "Lane.note: gap_s must be >= 0 (0 or inf: no check), not %R",
                     PyTuple_GET_ITEM(args, 3));
        return NULL;
    }
    if (isnan(last_seen)) {
        PyErr_SetString(PyExc_ValueError, "Lane.note: last_seen is NaN");
        return NULL;
    }
    const unsigned char *data = (const unsigned char *)rid;
    size_t len = (size_t)rid_len;
    uint64_t hash = hash_bytes(data, len);
    unsigned char *client_id = NULL;
    if (cid_len > 0) {
        client_id = malloc((size_t)cid_len);
        if (client_id == NULL)
            return PyErr_NoMemory();
        memcpy(client_id, cid, (size_t)cid_len);
    }
    int failed = 0;
    py_lock(self);
    s0_table *t = &self->sessions.entries[channel];
    s0_entry *e = (s0_entry *)table_find(t, data, len, hash);
    if (e == NULL) {
        if (table_reserve(t, 1) < 0 ||
            (e = record_new(sizeof(s0_entry), data, len, hash)) == NULL) {
            failed = 1;
        } else {
            e->heard_at = -1;
            e->channel = channel;
            e->last_seen = last_seen;
            table_insert(t, &e->key);
        }
    }
    if (e != NULL) {
        e->promise_ms = promise;
        e->gap_s = gap;
        e->majordomo = majordomo;
        e->open = open;
        free(e->client_id);
        e->client_id = client_id;
        e->client_id_len = (size_t)cid_len;
        client_id = NULL;
        if (last_seen > e->last_seen)
            e->last_seen = last_seen;
        /* Python may be handling one of its messages now (its note says so): Order */
        if (self->sessions.passed_seq[channel] > e->last_passed)
            e->last_passed = self->sessions.passed_seq[channel];
        /* The core answers in the reading spoken last: so do the lane's records of it */
        if (channel == 0 && majordomo != 0 && count_of(&self->rid_counts, data, len) > 0)
            for (size_t i = 0; i < self->n_heap; i++) {
                s0_record *r = self->heap[i];
                if (!r->s0p && r->crid_len == len &&
                    (len == 0 || memcmp(r->crid, data, len) == 0))
                    r->reading = majordomo; /* (an S0P record's client stays S0P) */
            }
    }
    pthread_mutex_unlock(&self->mutex);
    free(client_id); /* (not kept: out of memory) */
    if (failed)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *lane_forget(LaneObject *self, PyObject *args) {
    int channel;
    const char *rid;
    Py_ssize_t rid_len;
    if (!PyArg_ParseTuple(args, "iy#:forget", &channel, &rid, &rid_len) ||
        parse_channel(self, channel) < 0)
        return NULL;
    py_lock(self);
    s0_entry *e = entry_find(&self->sessions, channel, (const unsigned char *)rid, (size_t)rid_len);
    if (e != NULL) {
        heard_drop(&self->sessions, e);
        table_remove(&self->sessions.entries[channel], &e->key);
        entry_free(e);
    }
    pthread_mutex_unlock(&self->mutex);
    Py_RETURN_NONE;
}

static PyObject *lane_clear(LaneObject *self, PyObject *unused) {
    (void)unused;
    py_lock(self);
    sessions_clear(&self->sessions);
    pthread_mutex_unlock(&self->mutex);
    Py_RETURN_NONE;
}

static int parse_fd(const LaneObject *self, PyObject *args, const char *format, int *channel,
                    int *fd) {
    if (!PyArg_ParseTuple(args, format, channel, fd) || parse_channel(self, *channel) < 0)
        return -1;
    if (*fd < 0 || *fd >= S0_LANE_MAX_FD) {
        PyErr_Format(PyExc_ValueError, "Lane: fd must be in 0..%d, not %d", S0_LANE_MAX_FD - 1,
                     *fd);
        return -1;
    }
    return 0;
}

static PyObject *lane_negotiated(LaneObject *self, PyObject *args) {
    int channel, fd;
    if (parse_fd(self, args, "ii:negotiated", &channel, &fd) < 0)
        return NULL;
    int failed = 0;
    py_lock(self);
    s0_sessions *t = &self->sessions;
    if ((size_t)fd >= t->negotiated_cap[channel]) {
        size_t cap = t->negotiated_cap[channel] ? t->negotiated_cap[channel] : 256;
        while (cap <= (size_t)fd)
            cap *= 2;
        unsigned char *grown = realloc(t->negotiated[channel], cap);
        if (grown == NULL) {
            failed = 1;
        } else {
            memset(grown + t->negotiated_cap[channel], 0, cap - t->negotiated_cap[channel]);
            t->negotiated[channel] = grown;
            t->negotiated_cap[channel] = cap;
        }
    }
    if (!failed)
        t->negotiated[channel][fd] = 1;
    pthread_mutex_unlock(&self->mutex);
    if (failed)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *lane_gone(LaneObject *self, PyObject *args) {
    int channel, fd;
    if (parse_fd(self, args, "ii:gone", &channel, &fd) < 0)
        return NULL;
    py_lock(self);
    s0_sessions *t = &self->sessions;
    if ((size_t)fd < t->negotiated_cap[channel])
        t->negotiated[channel][fd] = 0;
    pthread_mutex_unlock(&self->mutex);
    Py_RETURN_NONE;
}

typedef struct {
    int channel;
    double last_seen;
    size_t len;
    unsigned char *rid; /* into the copy's block */
} s0_heard_copy;

static int heard_order(const void *a, const void *b) {
    const s0_heard_copy *x = a, *y = b;
    if (x->last_seen != y->last_seen)
        return x->last_seen < y->last_seen ? -1 : 1;
    if (x->channel != y->channel)
        return x->channel - y->channel;
    size_t n = x->len < y->len ? x->len : y->len;
    int c = n ? memcmp(x->rid, y->rid, n) : 0;
    if (c != 0)
        return c;
    return x->len < y->len ? -1 : x->len > y->len;
}

static PyObject *lane_heard(LaneObject *self, PyObject *unused) {
    (void)unused;
    s0_heard_copy *copies = NULL;
    unsigned char *block = NULL;
    size_t n = 0;
    int failed = 0;
    py_lock(self);
    s0_sessions *t = &self->sessions;
    size_t n_entries = t->n_heard, n_links = 0, bytes = 0;
    for (size_t i = 0; i < n_entries; i++)
        bytes += t->heard[i]->key.len;
    for (size_t i = 0; i < self->n_links; i++)
        if (self->link_set[i]->heard) {
            n_links++;
            bytes += self->link_set[i]->id_len;
        }
    n = n_entries + n_links;
    if (n > 0) {
        copies = malloc(n * sizeof(*copies));
        block = malloc(bytes ? bytes : 1);
        if (copies == NULL || block == NULL) {
            failed = 1;
        } else {
            size_t at = 0;
            for (size_t i = 0; i < n_entries; i++) {
                s0_entry *e = t->heard[i];
                copies[i].channel = e->channel;
                copies[i].last_seen = e->last_seen;
                copies[i].len = e->key.len;
                copies[i].rid = block + at;
                if (e->key.len)
                    memcpy(block + at, e->key.data, e->key.len);
                at += e->key.len;
                e->heard_at = -1;
            }
            t->n_heard = 0;
            size_t k = n_entries;
            for (size_t i = 0; i < self->n_links; i++) { /* a link a FORWARDREPLY came on */
                s0_link *l = self->link_set[i];
                if (!l->heard)
                    continue;
                copies[k].channel = S0_LINKS;
                copies[k].last_seen = l->last_seen;
                copies[k].len = l->id_len;
                copies[k].rid = block + at;
                memcpy(block + at, l->id, l->id_len);
                at += l->id_len;
                l->heard = 0;
                k++;
            }
        }
    }
    pthread_mutex_unlock(&self->mutex);
    PyObject *out = NULL;
    if (failed) {
        PyErr_NoMemory();
        goto done;
    }
    if (n > 1)
        qsort(copies, n, sizeof(*copies), heard_order);
    out = PyList_New((Py_ssize_t)n);
    if (out == NULL)
        goto done;
    for (size_t i = 0; i < n; i++) {
        PyObject *item = Py_BuildValue("(iy#d)", copies[i].channel, (const char *)copies[i].rid,
                                       (Py_ssize_t)copies[i].len, copies[i].last_seen);
        if (item == NULL) {
            Py_CLEAR(out); /* (what was heard is lost with the MemoryError) */
            goto done;
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, item);
    }
done:
    free(copies);
    free(block);
    return out;
}

static PyObject *lane_last_seen(LaneObject *self, PyObject *args) {
    int channel;
    const char *rid;
    Py_ssize_t rid_len;
    if (!PyArg_ParseTuple(args, "iy#:last_seen", &channel, &rid, &rid_len) ||
        parse_channel(self, channel) < 0)
        return NULL;
    int found = 0;
    double seen = 0.0;
    py_lock(self);
    s0_entry *e = entry_find(&self->sessions, channel, (const unsigned char *)rid, (size_t)rid_len);
    if (e != NULL) {
        found = 1;
        seen = e->last_seen;
    }
    pthread_mutex_unlock(&self->mutex);
    if (!found)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(seen);
}

static PyObject *lane_stats(LaneObject *self, PyObject *unused) {
    (void)unused;
    uint64_t values[ST_COUNT];
    for (int i = 0; i < ST_COUNT; i++)
        values[i] = __atomic_load_n(&self->stats[i], __ATOMIC_RELAXED);
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    for (int i = 0; i < ST_COUNT; i++) {
        PyObject *v = PyLong_FromUnsignedLongLong(values[i]);
        if (v == NULL || PyDict_SetItemString(out, STAT_NAMES[i], v) < 0) {
            Py_XDECREF(v);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(v);
    }
    py_lock(self);
    size_t waiting = self->n_waiting;
    pthread_mutex_unlock(&self->mutex);
    PyObject *v = PyLong_FromSize_t(waiting);
    if (v == NULL || PyDict_SetItemString(out, "waiting", v) < 0) {
        Py_XDECREF(v);
        Py_DECREF(out);
        return NULL;
    }
    Py_DECREF(v);
    return out;
}

/* ---- phase 3b: the lock, the pool, the gates, the records ----------------------------------- */

static PyObject *lane_lock(LaneObject *self, PyObject *unused) {
    (void)unused;
    py_lock(self);
    self->python_holds++;
    Py_RETURN_NONE;
}

static PyObject *lane_unlock(LaneObject *self, PyObject *unused) {
    (void)unused;
    if (self->python_holds <= 0) {
        PyErr_SetString(PyExc_RuntimeError, "Lane.unlock: the lock is not held (unlock() without "
                                            "a matching lock())");
        return NULL;
    }
    if (pthread_mutex_unlock(&self->mutex) != 0) { /* EPERM: another thread holds it */
        PyErr_SetString(PyExc_RuntimeError,
                        "Lane.unlock: this thread does not hold the lock (another one's lock())");
        return NULL;
    }
    self->python_holds--;
    Py_RETURN_NONE;
}

static PyObject *lane_attach_pool(LaneObject *self, PyObject *arg) {
    struct s0_pool *pool = NULL;
    if (arg != Py_None) {
        if (pool_api == NULL) {
            /* (PyCapsule_Import, but through sys.modules: a test may load another build) */
            PyObject *module = PyImport_ImportModule("scale0.core._pool");
            PyObject *capsule = module ? PyObject_GetAttrString(module, "_C_API") : NULL;
            const s0_pool_api *api =
                capsule ? PyCapsule_GetPointer(capsule, S0_POOL_CAPSULE) : NULL;
            Py_XDECREF(capsule);
            Py_XDECREF(module);
            if (api == NULL)
                return NULL;
            if (api->version != S0_POOL_API_VERSION) {
                PyErr_Format(PyExc_ImportError,
                             "Lane.attach_pool: scale0.core._pool's C API is version %d, this "
                             "lane speaks %d (rebuild both)",
                             api->version, S0_POOL_API_VERSION);
                return NULL;
            }
            pool_api = api;
        }
        pool = pool_api->pool_of(arg);
        if (pool == NULL) {
            PyErr_Format(PyExc_TypeError,
                         "Lane.attach_pool: pool must be a scale0.core._pool.Pool or None, not "
                         "%.100s",
                         Py_TYPE(arg)->tp_name);
            return NULL;
        }
    }
    py_lock(self);
    PyObject *old = self->pool_obj;
    if (self->pool != NULL)
        pool_api->set_guard(self->pool, NULL);
    self->pool = pool;
    self->pool_obj = NULL;
    if (pool != NULL) {
        Py_INCREF(arg);
        self->pool_obj = arg;
        pool_api->set_guard(pool, &self->python_holds);
    }
    pthread_mutex_unlock(&self->mutex);
    Py_XDECREF(old);
    Py_RETURN_NONE;
}

static PyObject *lane_serve(LaneObject *self, PyObject *args) {
    int on;
    double timeout;
    long long cap;
    const char *prefix;
    Py_ssize_t prefix_len;
    long long max_queued;
    int may_queue;
    if (!PyArg_ParseTuple(args, "pdLy#Lp:serve", &on, &timeout, &cap, &prefix, &prefix_len,
                          &max_queued, &may_queue))
        return NULL;
    if (max_queued < 0) {
        PyErr_Format(PyExc_ValueError, "Lane.serve: max_queued must be >= 0, not %lld",
                     max_queued);
        return NULL;
    }
    if (isnan(timeout) || timeout < 0) {
        PyErr_Format(PyExc_ValueError, "Lane.serve: timeout_s must be >= 0, not %R",
                     PyTuple_GET_ITEM(args, 1));
        return NULL;
    }
    if (cap < 0) {
        PyErr_Format(PyExc_ValueError, "Lane.serve: max_per_client must be >= 0, not %lld", cap);
        return NULL;
    }
    if (prefix_len > 255 - 8) {
        PyErr_Format(PyExc_ValueError,
                     "Lane.serve: ticket_prefix is %zd bytes; a ticket (it and 8 more) must fit "
                     "in 255",
                     prefix_len);
        return NULL;
    }
    py_lock(self);
    self->serving = on;
    self->timeout_s = timeout;
    self->max_per_client = cap;
    memcpy(self->prefix, prefix, (size_t)prefix_len);
    self->prefix_len = (size_t)prefix_len;
    self->max_queued = max_queued;
    self->may_queue = may_queue;
    pthread_mutex_unlock(&self->mutex);
    Py_RETURN_NONE;
}

/* Set `data`'s count in the gate table `t` (0 removes it; the lock taken here). */
static PyObject *gate_set(LaneObject *self, s0_table *t, const void *data, size_t len,
                          long long n) {
    int failed = 0;
    py_lock(self);
    s0_count *c = n > 0 ? count_make(t, data, len) : count_find(t, data, len);
    if (c == NULL) {
        failed = n > 0;
    } else {
        c->n = n;
        count_settle(t, c);
    }
    pthread_mutex_unlock(&self->mutex);
    if (failed)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *lane_python_waits(LaneObject *self, PyObject *args) {
    PyObject *service;
    long long waits;
    if (!PyArg_ParseTuple(args, "UL:python_waits", &service, &waits))
        return NULL;
    if (waits < 0) {
        PyErr_Format(PyExc_ValueError, "Lane.python_waits: count must be >= 0, not %lld", waits);
        return NULL;
    }
    PyObject *utf8 = PyUnicode_AsEncodedString(service, "utf-8", "surrogatepass");
    if (utf8 == NULL)
        return NULL;
    PyObject *out = gate_set(self, &self->waits, PyBytes_AS_STRING(utf8),
                             (size_t)PyBytes_GET_SIZE(utf8), waits);
    Py_DECREF(utf8);
    return out;
}

static PyObject *lane_python_holds(LaneObject *self, PyObject *args) {
    const char *cid;
    Py_ssize_t len;
    long long holds;
    if (!PyArg_ParseTuple(args, "y#L:python_holds", &cid, &len, &holds))
        return NULL;
    if (holds < 0) {
        PyErr_Format(PyExc_ValueError, "Lane.python_holds: count must be >= 0, not %lld", holds);
        return NULL;
    }
    return gate_set(self, &self->holds, cid, (size_t)len, holds);
}

/* (ticket, worker_rid, client_rid, client_id, caller, service, body, started, deadline,
 * request_id, seq, ids, origin, via, limit) of a record handed over (ticket and worker_rid b""
 * while it waits; ids: its request_id the client's own; origin, via, limit: a forwarded one's,
 * else b"", "", inf: see "Forwards"). */
static PyObject *record_tuple(s0_record *r) {
    PyObject *body = PyTuple_New((Py_ssize_t)r->n_body);
    if (body == NULL)
        return NULL;
    for (size_t i = 0; i < r->n_body; i++) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)p_msg_data(&r->body[i]),
                                                (Py_ssize_t)p_msg_size(&r->body[i]));
        if (b == NULL) {
            Py_DECREF(body);
            return NULL;
        }
        PyTuple_SET_ITEM(body, (Py_ssize_t)i, b);
    }
    char mdp_id[32];
    const char *request_id = mdp_id;
    Py_ssize_t id_len;
    if (r->s0p) {
        request_id = (const char *)r->request_id;
        id_len = (Py_ssize_t)r->request_id_len;
    } else {
        id_len = snprintf(mdp_id, sizeof(mdp_id), "mdp.L%llu", (unsigned long long)r->number);
    }
    return Py_BuildValue("(y#y#y#y#s#s#Nddy#KNy#s#ds#)", (const char *)r->key.data,
                         (Py_ssize_t)r->key.len, (const char *)r->wrid, (Py_ssize_t)r->wrid_len,
                         (const char *)r->crid, (Py_ssize_t)r->crid_len,
                         (const char *)r->client_id, (Py_ssize_t)r->client_id_len,
                         (const char *)r->caller, (Py_ssize_t)r->caller_len,
                         (const char *)r->service, (Py_ssize_t)r->service_len, body, r->started,
                         r->deadline, request_id, id_len, (unsigned long long)r->seq,
                         PyBool_FromLong(r->ids), r->origin ? (const char *)r->origin : "",
                         (Py_ssize_t)r->origin_len, r->via ? (const char *)r->via : "",
                         (Py_ssize_t)r->via_len, r->limit,
                         r->peer ? (const char *)r->peer : "", (Py_ssize_t)r->peer_len);
}

static int seq_order(const void *a, const void *b) {
    const s0_record *x = *(s0_record *const *)a, *y = *(s0_record *const *)b;
    return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* In flight (a ticket) by ticket, then waiting (none) by seq. */
static int ticket_order(const void *a, const void *b) {
    const s0_record *x = *(s0_record *const *)a, *y = *(s0_record *const *)b;
    if ((x->queue == NULL) != (y->queue == NULL))
        return x->queue == NULL ? -1 : 1;
    if (x->queue != NULL)
        return seq_order(a, b);
    size_t n = x->key.len < y->key.len ? x->key.len : y->key.len;
    int c = n ? memcmp(x->key.data, y->key.data, n) : 0;
    if (c != 0)
        return c;
    return x->key.len < y->key.len ? -1 : x->key.len > y->key.len;
}

/* The records in `got` (out of the lane already, the lock released) as a list, freed. */
static PyObject *handed_list(s0_record **got, size_t n) {
    PyObject *out = PyList_New((Py_ssize_t)n);
    for (size_t i = 0; i < n; i++) {
        if (out != NULL) {
            PyObject *item = record_tuple(got[i]);
            if (item == NULL)
                Py_CLEAR(out); /* (the records are lost with the MemoryError) */
            else
                PyList_SET_ITEM(out, (Py_ssize_t)i, item);
        }
        record_free(got[i]);
    }
    free(got);
    return out;
}

enum { ADOPT_WORKER, ADOPT_ALL, ADOPT_DUE, ADOPT_PEER };

/* Hand Python the records `which` selects (the lock taken here; built after it is released). */
static PyObject *adopt_many(LaneObject *self, int which, const void *rid, size_t rid_len,
                            double now) {
    s0_record **got = NULL;
    size_t n = 0;
    int failed = 0;
    py_lock(self);
    size_t most = self->n_heap;
    if (most > 0 && (got = malloc(most * sizeof(*got))) == NULL)
        failed = 1;
    if (!failed && which == ADOPT_DUE) {
        while (self->n_heap > 0 && self->heap[0]->deadline <= now) {
            s0_record *r = self->heap[0];
            record_out(self, r);
            got[n++] = r;
        }
    } else if (!failed) {
        for (size_t i = 0; i < self->n_heap; i++) {
            s0_record *r = self->heap[i];
            if (which == ADOPT_ALL ||
                (which == ADOPT_WORKER && r->queue == NULL && !r->out &&
                 r->wrid_len == rid_len &&
                 (rid_len == 0 || memcmp(r->wrid, rid, rid_len) == 0)) ||
                (which == ADOPT_PEER && r->out && r->peer_len == rid_len &&
                 memcmp(r->peer, rid, rid_len) == 0))
                got[n++] = r;
        }
        if (n > 1) /* (ordered before they leave: the order reads whether they wait) */
            qsort(got, n, sizeof(*got), ticket_order);
        for (size_t i = 0; i < n; i++)
            record_out(self, got[i]);
    }
    if (n > 0)
        count(self, ST_HANDED, n);
    pthread_mutex_unlock(&self->mutex);
    if (failed)
        return PyErr_NoMemory();
    return handed_list(got, n);
}

static PyObject *lane_adopt(LaneObject *self, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "Lane.adopt: ticket must be bytes, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    const void *data = PyBytes_AS_STRING(arg);
    size_t len = (size_t)PyBytes_GET_SIZE(arg);
    py_lock(self);
    s0_record *r = (s0_record *)table_find(&self->records, data, len, hash_bytes(data, len));
    if (r != NULL) {
        record_out(self, r);
        count(self, ST_HANDED, 1);
    }
    pthread_mutex_unlock(&self->mutex);
    if (r == NULL)
        Py_RETURN_NONE;
    PyObject *out = record_tuple(r);
    record_free(r);
    return out;
}

static PyObject *lane_adopt_worker(LaneObject *self, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "Lane.adopt_worker: routing_id must be bytes, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    return adopt_many(self, ADOPT_WORKER, PyBytes_AS_STRING(arg), (size_t)PyBytes_GET_SIZE(arg),
                      0.0);
}

static PyObject *lane_adopt_all(LaneObject *self, PyObject *unused) {
    (void)unused;
    return adopt_many(self, ADOPT_ALL, NULL, 0, 0.0);
}

static PyObject *lane_adopt_due(LaneObject *self, PyObject *arg) {
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    if (isnan(now)) {
        PyErr_SetString(PyExc_ValueError, "Lane.adopt_due: now is NaN");
        return NULL;
    }
    return adopt_many(self, ADOPT_DUE, NULL, 0, now);
}

static PyObject *lane_next_due(LaneObject *self, PyObject *unused) {
    (void)unused;
    int any;
    double due = 0.0;
    py_lock(self);
    any = self->n_heap > 0;
    if (any)
        due = self->heap[0]->deadline;
    pthread_mutex_unlock(&self->mutex);
    if (!any)
        Py_RETURN_NONE;
    return PyFloat_FromDouble(due);
}

static PyObject *lane_held(LaneObject *self, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "Lane.held: client_id must be bytes, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    py_lock(self);
    long long n = count_of(&self->client_counts, PyBytes_AS_STRING(arg),
                           (size_t)PyBytes_GET_SIZE(arg));
    pthread_mutex_unlock(&self->mutex);
    return PyLong_FromLongLong(n);
}

static PyObject *lane_busy(LaneObject *self, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "Lane.busy: client_rid must be bytes, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    py_lock(self);
    long long n = count_of(&self->rid_counts, PyBytes_AS_STRING(arg),
                           (size_t)PyBytes_GET_SIZE(arg));
    pthread_mutex_unlock(&self->mutex);
    return PyBool_FromLong(n > 0);
}

static PyObject *lane_in_flight(LaneObject *self, PyObject *unused) {
    (void)unused;
    py_lock(self);
    size_t n = self->records.used;
    pthread_mutex_unlock(&self->mutex);
    return PyLong_FromSize_t(n);
}

static int svc_order(const void *a, const void *b) {
    const s0_svc *x = *(s0_svc *const *)a, *y = *(s0_svc *const *)b;
    size_t n = x->key.len < y->key.len ? x->key.len : y->key.len;
    int c = n ? memcmp(x->key.data, y->key.data, n) : 0;
    if (c != 0)
        return c;
    return x->key.len < y->key.len ? -1 : x->key.len > y->key.len;
}

/* (service, status): the service's bytes, then the status. */
static int hist_order(const void *a, const void *b) {
    const s0_hist *x = *(s0_hist *const *)a, *y = *(s0_hist *const *)b;
    size_t n = x->service_len < y->service_len ? x->service_len : y->service_len;
    int c = n ? memcmp(x->key.data, y->key.data, n) : 0;
    if (c != 0)
        return c;
    if (x->service_len != y->service_len)
        return x->service_len < y->service_len ? -1 : 1;
    return (x->status > y->status) - (x->status < y->status);
}

/* Every record of `t` in a malloc'd array (*n set; NULL and n 0 if none), -1 out of memory. */
static int table_list(const s0_table *t, void ***out, size_t *n) {
    *n = 0;
    *out = NULL;
    if (t->used == 0)
        return 0;
    void **all = malloc(t->used * sizeof(*all));
    if (all == NULL)
        return -1;
    for (size_t i = 0; i <= t->mask; i++)
        if (t->slots[i] != NULL)
            all[(*n)++] = t->slots[i];
    *out = all;
    return 0;
}

static PyObject *lane_drain(LaneObject *self, PyObject *unused) {
    (void)unused;
    py_lock(self);
    s0_table svcs = self->svcs; /* taken whole: the lane starts new ones */
    s0_table hists = self->hists;
    memset(&self->svcs, 0, sizeof(self->svcs));
    memset(&self->hists, 0, sizeof(self->hists));
    uint64_t requests = self->drain_requests, replies = self->drain_replies;
    uint64_t forwards = self->drain_forwards, forwarded = self->drain_forwarded;
    self->drain_requests = self->drain_replies = self->drain_forwards = 0;
    self->drain_forwarded = 0;
    pthread_mutex_unlock(&self->mutex);
    PyObject *out = NULL, *hist = NULL, *changed = NULL;
    size_t n = 0, n_hists = 0;
    s0_svc **all = NULL;
    s0_hist **by = NULL;
    if (table_list(&svcs, (void ***)&all, &n) < 0 || table_list(&hists, (void ***)&by, &n_hists) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (n > 1)
        qsort(all, n, sizeof(*all), svc_order);
    if (n_hists > 1)
        qsort(by, n_hists, sizeof(*by), hist_order);
    hist = PyList_New(0);
    changed = PyList_New(0);
    if (hist == NULL || changed == NULL)
        goto done;
    for (size_t i = 0; i < n; i++) {
        s0_svc *v = all[i];
        if (!v->changed)
            continue;
        PyObject *name = PyUnicode_DecodeUTF8((const char *)v->key.data, (Py_ssize_t)v->key.len,
                                              "surrogatepass");
        int bad = name == NULL || PyList_Append(changed, name) < 0;
        Py_XDECREF(name);
        if (bad)
            goto done;
    }
    for (size_t i = 0; i < n_hists; i++) {
        s0_hist *v = by[i];
        if (!v->observed)
            continue;
        PyObject *name = PyUnicode_DecodeUTF8((const char *)v->key.data,
                                              (Py_ssize_t)v->service_len, "surrogatepass");
        PyObject *counts = name != NULL ? PyList_New(S0_BUCKETS + 1) : NULL;
        PyObject *item = NULL;
        if (counts != NULL) {
            for (int k = 0; k <= S0_BUCKETS; k++) {
                PyObject *c = PyLong_FromUnsignedLongLong(v->counts[k]);
                if (c == NULL) {
                    Py_CLEAR(counts);
                    break;
                }
                PyList_SET_ITEM(counts, k, c);
            }
        }
        if (counts != NULL)
            item = Py_BuildValue("(OiNd)", name, v->status, counts, v->sum_s);
        Py_XDECREF(name);
        int bad = item == NULL || PyList_Append(hist, item) < 0;
        Py_XDECREF(item);
        if (bad)
            goto done;
    }
    out = Py_BuildValue("(KKOOKK)", (unsigned long long)requests, (unsigned long long)replies,
                        hist, changed, (unsigned long long)forwards,
                        (unsigned long long)forwarded);
done:
    Py_XDECREF(hist);
    Py_XDECREF(changed);
    free(all);
    free(by);
    table_free_all(&svcs);
    table_free_all(&hists);
    return out;
}

/* ---- phase 3b, second step: the lane's queues, the one numbering ---------------------------- */

/* `service` (str) as UTF-8 bytes (a new reference), NULL with an error set. */
static PyObject *service_bytes(PyObject *service, const char *method) {
    if (!PyUnicode_Check(service)) {
        PyErr_Format(PyExc_TypeError, "Lane.%s: service must be str, not %.100s", method,
                     Py_TYPE(service)->tp_name);
        return NULL;
    }
    return PyUnicode_AsEncodedString(service, "utf-8", "surrogatepass");
}

static PyObject *lane_waiting_head(LaneObject *self, PyObject *arg) {
    PyObject *name = service_bytes(arg, "waiting_head");
    if (name == NULL)
        return NULL;
    py_lock(self);
    s0_wq *q = wq_find(self, PyBytes_AS_STRING(name), (size_t)PyBytes_GET_SIZE(name));
    PyObject *out = q != NULL ? record_tuple(q->head) : Py_NewRef(Py_None);
    pthread_mutex_unlock(&self->mutex);
    Py_DECREF(name);
    return out;
}

static PyObject *lane_adopt_next_waiting(LaneObject *self, PyObject *arg) {
    PyObject *name = service_bytes(arg, "adopt_next_waiting");
    if (name == NULL)
        return NULL;
    py_lock(self);
    s0_wq *q = wq_find(self, PyBytes_AS_STRING(name), (size_t)PyBytes_GET_SIZE(name));
    s0_record *r = q != NULL ? q->head : NULL;
    if (r != NULL) {
        record_out(self, r);
        count(self, ST_HANDED, 1);
    }
    pthread_mutex_unlock(&self->mutex);
    Py_DECREF(name);
    if (r == NULL)
        Py_RETURN_NONE;
    PyObject *out = record_tuple(r);
    record_free(r);
    return out;
}

static PyObject *lane_adopt_waiting(LaneObject *self, PyObject *arg) {
    PyObject *name = service_bytes(arg, "adopt_waiting");
    if (name == NULL)
        return NULL;
    s0_record **got = NULL;
    size_t n = 0;
    int failed = 0;
    py_lock(self);
    s0_wq *q = wq_find(self, PyBytes_AS_STRING(name), (size_t)PyBytes_GET_SIZE(name));
    if (q != NULL) {
        if ((got = malloc(q->n * sizeof(*got))) == NULL) {
            failed = 1;
        } else {
            for (s0_record *r = q->head; r != NULL; r = r->qnext)
                got[n++] = r;
            for (size_t i = 0; i < n; i++)
                record_out(self, got[i]); /* (the last one frees q) */
            count(self, ST_HANDED, n);
        }
    }
    pthread_mutex_unlock(&self->mutex);
    Py_DECREF(name);
    if (failed)
        return PyErr_NoMemory();
    return handed_list(got, n);
}

static PyObject *lane_dispatch_head(LaneObject *self, PyObject *args) {
    PyObject *service;
    const char *ticket, *wrid;
    Py_ssize_t ticket_len, wrid_len;
    if (!PyArg_ParseTuple(args, "Uy#y#:dispatch_head", &service, &ticket, &ticket_len, &wrid,
                          &wrid_len))
        return NULL;
    if (wrid_len < 1 || wrid_len > 255) {
        PyErr_Format(PyExc_ValueError,
                     "Lane.dispatch_head: worker_rid must be 1..255 bytes, not %zd", wrid_len);
        return NULL;
    }
    PyObject *name = service_bytes(service, "dispatch_head");
    if (name == NULL)
        return NULL;
    const char *problem = NULL;
    py_lock(self);
    s0_wq *q = wq_find(self, PyBytes_AS_STRING(name), (size_t)PyBytes_GET_SIZE(name));
    s0_record *r = q != NULL ? q->head : NULL;
    if (r == NULL)
        problem = "empty";
    else if (table_find(&self->records, (const unsigned char *)ticket, (size_t)ticket_len,
                        hash_bytes((const unsigned char *)ticket, (size_t)ticket_len)) != NULL)
        problem = "ticket";
    else if (table_reserve(&self->records, 1) < 0 ||
             record_set_ticket(r, ticket, (size_t)ticket_len) < 0)
        problem = "memory";
    if (problem == NULL) {
        wq_unlink(self, r);
        record_set_worker(r, wrid, (size_t)wrid_len);
        table_insert(&self->records, &r->key);
        count(self, ST_LENT, 1);
    }
    pthread_mutex_unlock(&self->mutex);
    if (problem == NULL) {
        Py_DECREF(name);
        Py_RETURN_NONE;
    }
    if (problem[0] == 'e')
        PyErr_Format(PyExc_KeyError, "Lane.dispatch_head: no request of %R waits in the lane",
                     service);
    else if (problem[0] == 't')
        PyErr_Format(PyExc_ValueError,
                     "Lane.dispatch_head: ticket %R is already one of the lane's in flight",
                     PyTuple_GET_ITEM(args, 1));
    else
        PyErr_NoMemory();
    Py_DECREF(name);
    return NULL;
}

static PyObject *lane_waiting(LaneObject *self, PyObject *arg) {
    PyObject *name = service_bytes(arg, "waiting");
    if (name == NULL)
        return NULL;
    py_lock(self);
    size_t n = wq_count(self, PyBytes_AS_STRING(name), (size_t)PyBytes_GET_SIZE(name));
    pthread_mutex_unlock(&self->mutex);
    Py_DECREF(name);
    return PyLong_FromSize_t(n);
}

static PyObject *lane_waiting_total(LaneObject *self, PyObject *unused) {
    (void)unused;
    py_lock(self);
    size_t n = self->n_waiting;
    pthread_mutex_unlock(&self->mutex);
    return PyLong_FromSize_t(n);
}

/* A count table as {bytes: int} (the lock held; the GIL too). */
static PyObject *counts_dict(const s0_table *t) {
    PyObject *out = PyDict_New();
    if (out == NULL || t->slots == NULL)
        return out;
    for (size_t i = 0; i <= t->mask; i++) {
        const s0_count *c = (const s0_count *)t->slots[i];
        if (c == NULL)
            continue;
        PyObject *k = PyBytes_FromStringAndSize((const char *)c->key.data, (Py_ssize_t)c->key.len);
        PyObject *v = k != NULL ? PyLong_FromLongLong(c->n) : NULL;
        if (v == NULL || PyDict_SetItem(out, k, v) < 0) {
            Py_XDECREF(k);
            Py_XDECREF(v);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(k);
        Py_DECREF(v);
    }
    return out;
}

/* out[key] += 1 (0 when absent); key's reference is stolen. 0, or -1 with an exception. */
static int dict_count(PyObject *out, PyObject *key) {
    if (key == NULL)
        return -1;
    PyObject *was = PyDict_GetItemWithError(out, key); /* borrowed */
    long long n = was != NULL ? PyLong_AsLongLong(was) : 0;
    PyObject *v = PyErr_Occurred() ? NULL : PyLong_FromLongLong(n + 1);
    int rc = v == NULL ? -1 : PyDict_SetItem(out, key, v);
    Py_XDECREF(v);
    Py_DECREF(key);
    return rc;
}

static PyObject *lane_open_by_connection(LaneObject *self, PyObject *unused) {
    (void)unused;
    py_lock(self);
    PyObject *out = counts_dict(&self->rid_counts);
    /* A peer link's FORWARDs count by its routing id too (the ledger's open_by_connection
     * counts every request by the routing id it answers), though in no client's count. */
    for (size_t i = 0; out != NULL && i < self->n_heap; i++) {
        const s0_record *r = self->heap[i];
        if (r->fwd &&
            dict_count(out, PyBytes_FromStringAndSize((const char *)r->crid,
                                                      (Py_ssize_t)r->crid_len)) < 0)
            Py_CLEAR(out);
    }
    pthread_mutex_unlock(&self->mutex);
    return out;
}

static PyObject *lane_held_from(LaneObject *self, PyObject *arg) {
    if (!PyUnicode_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "Lane.held_from: via must be str, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    Py_ssize_t via_len;
    const char *via = PyUnicode_AsUTF8AndSize(arg, &via_len);
    if (via == NULL)
        return NULL;
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    py_lock(self);
    for (size_t i = 0; out != NULL && i < self->n_heap; i++) {
        const s0_record *r = self->heap[i];
        if (r->fwd && r->via_len == (size_t)via_len && memcmp(r->via, via, r->via_len) == 0 &&
            dict_count(out, PyUnicode_DecodeUTF8((const char *)r->service,
                                                 (Py_ssize_t)r->service_len, "strict")) < 0)
            Py_CLEAR(out);
    }
    pthread_mutex_unlock(&self->mutex);
    return out;
}

static PyObject *lane_held_by_client(LaneObject *self, PyObject *unused) {
    (void)unused;
    py_lock(self);
    PyObject *out = counts_dict(&self->client_counts);
    pthread_mutex_unlock(&self->mutex);
    return out;
}

static PyObject *lane_next_seq(LaneObject *self, PyObject *unused) {
    (void)unused;
    py_lock(self);
    uint64_t n = ++self->seq;
    pthread_mutex_unlock(&self->mutex);
    return PyLong_FromUnsignedLongLong(n);
}

static PyObject *lane_seq_from(LaneObject *self, PyObject *arg) {
    if (!PyLong_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "Lane.seq_from: n must be int, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    unsigned long long n = PyLong_AsUnsignedLongLong(arg);
    if (n == (unsigned long long)-1 && PyErr_Occurred()) {
        PyErr_Clear();
        PyErr_Format(PyExc_ValueError, "Lane.seq_from: n must be 0..2**64-1, not %R", arg);
        return NULL;
    }
    py_lock(self);
    if (n > self->seq)
        self->seq = n;
    pthread_mutex_unlock(&self->mutex);
    Py_RETURN_NONE;
}


/* ---- S0P requests: R10's keys and the reply cache --------------------------------------------- */

static PyObject *lane_python_key(LaneObject *self, PyObject *args) {
    const char *cid, *rq;
    Py_ssize_t cid_len, rq_len;
    int live;
    if (!PyArg_ParseTuple(args, "y#y#p:python_key", &cid, &cid_len, &rq, &rq_len, &live))
        return NULL;
    s0_rkey k;
    if (rkey_make(&k, cid, (size_t)cid_len, rq, (size_t)rq_len) < 0)
        return PyErr_NoMemory();
    int failed = 0;
    py_lock(self);
    if (live) {
        s0_count *c = count_make(&self->pkeys, k.data, k.len);
        if (c == NULL)
            failed = 1;
        else
            c->n = 1;
    } else {
        s0_count *c = count_find(&self->pkeys, k.data, k.len);
        if (c != NULL) {
            c->n = 0;
            count_settle(&self->pkeys, c);
        }
    }
    pthread_mutex_unlock(&self->mutex);
    rkey_free(&k);
    if (failed)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *lane_python_keys(LaneObject *self, PyObject *unused) {
    (void)unused;
    py_lock(self);
    size_t n = self->pkeys.used;
    pthread_mutex_unlock(&self->mutex);
    return PyLong_FromSize_t(n);
}

static PyObject *lane_adopt_key(LaneObject *self, PyObject *args) {
    const char *cid, *rq;
    Py_ssize_t cid_len, rq_len;
    if (!PyArg_ParseTuple(args, "y#y#:adopt_key", &cid, &cid_len, &rq, &rq_len))
        return NULL;
    s0_rkey k;
    if (rkey_make(&k, cid, (size_t)cid_len, rq, (size_t)rq_len) < 0)
        return PyErr_NoMemory();
    py_lock(self);
    s0_key *found = table_find(&self->lkeys, k.data, k.len, hash_bytes(k.data, k.len));
    s0_record *r = found != NULL ? RECORD_OF_IKEY(found) : NULL;
    if (r != NULL) {
        record_out(self, r);
        count(self, ST_HANDED, 1);
    }
    pthread_mutex_unlock(&self->mutex);
    rkey_free(&k);
    if (r == NULL)
        Py_RETURN_NONE;
    PyObject *out = record_tuple(r);
    record_free(r);
    return out;
}

static PyObject *lane_cache_limits(LaneObject *self, PyObject *args) {
    long long entries, bytes;
    double age;
    if (!PyArg_ParseTuple(args, "LLd:cache_limits", &entries, &bytes, &age))
        return NULL;
    if (entries < 0 || bytes < 0 || isnan(age) || age < 0) {
        PyErr_Format(PyExc_ValueError,
                     "Lane.cache_limits: max_entries, max_bytes and max_age_s must be >= 0, not "
                     "%R",
                     args);
        return NULL;
    }
    py_lock(self);
    self->cache.max_entries = entries;
    self->cache.max_bytes = bytes;
    self->cache.max_age_s = age;
    pthread_mutex_unlock(&self->mutex);
    Py_RETURN_NONE;
}

static PyObject *lane_cache_put(LaneObject *self, PyObject *args) {
    const char *cid, *rq;
    Py_ssize_t cid_len, rq_len;
    PyObject *service, *body;
    int status;
    double expires;
    if (!PyArg_ParseTuple(args, "y#y#UiOd:cache_put", &cid, &cid_len, &rq, &rq_len, &service,
                          &status, &body, &expires))
        return NULL;
    if (status < 100 || status > 599) {
        PyErr_Format(PyExc_ValueError, "Lane.cache_put: status must be 100..599, not %d", status);
        return NULL;
    }
    if (isnan(expires)) {
        PyErr_SetString(PyExc_ValueError, "Lane.cache_put: expires is NaN");
        return NULL;
    }
    if (!PyTuple_Check(body)) {
        PyErr_Format(PyExc_TypeError, "Lane.cache_put: body must be a tuple of bytes, not %.100s",
                     Py_TYPE(body)->tp_name);
        return NULL;
    }
    Py_ssize_t n = PyTuple_GET_SIZE(body);
    for (Py_ssize_t i = 0; i < n; i++)
        if (!PyBytes_Check(PyTuple_GET_ITEM(body, i))) {
            PyErr_Format(PyExc_TypeError, "Lane.cache_put: body[%zd] must be bytes, not %.100s",
                         i, Py_TYPE(PyTuple_GET_ITEM(body, i))->tp_name);
            return NULL;
        }
    PyObject *name = PyUnicode_AsEncodedString(service, "utf-8", "surrogatepass");
    if (name == NULL)
        return NULL;
    const unsigned char **ptrs = PyMem_Malloc(((size_t)n + 1) * sizeof(*ptrs));
    size_t *lens = PyMem_Malloc(((size_t)n + 1) * sizeof(*lens));
    s0_rkey k;
    int made = 0, failed = 0;
    if (ptrs != NULL && lens != NULL)
        made = rkey_make(&k, cid, (size_t)cid_len, rq, (size_t)rq_len) == 0;
    if (!made) {
        failed = 1;
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *b = PyTuple_GET_ITEM(body, i);
            ptrs[i] = (const unsigned char *)PyBytes_AS_STRING(b);
            lens[i] = (size_t)PyBytes_GET_SIZE(b);
        }
        py_lock(self);
        s0_cent *e = cache_entry(&self->cache, k.data, k.len, PyBytes_AS_STRING(name),
                                 (size_t)PyBytes_GET_SIZE(name), status, (size_t)n, ptrs, lens,
                                 expires);
        if (e == NULL)
            failed = 1;
        else
            cache_commit(&self->cache, e);
        pthread_mutex_unlock(&self->mutex);
    }
    if (made)
        rkey_free(&k);
    PyMem_Free(ptrs);
    PyMem_Free(lens);
    Py_DECREF(name);
    if (failed)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

/* An entry's (service, status, body) (the lock held; only bytes and str are made). */
static PyObject *cache_tuple(const s0_cent *e) {
    PyObject *body = PyTuple_New((Py_ssize_t)e->n_body);
    if (body == NULL)
        return NULL;
    const unsigned char *p = e->data;
    for (size_t i = 0; i < e->n_body; i++) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)p, (Py_ssize_t)e->lens[i]);
        if (b == NULL) {
            Py_DECREF(body);
            return NULL;
        }
        PyTuple_SET_ITEM(body, (Py_ssize_t)i, b);
        p += e->lens[i];
    }
    PyObject *service = PyUnicode_DecodeUTF8((const char *)e->service,
                                             (Py_ssize_t)e->service_len, "surrogatepass");
    if (service == NULL) {
        Py_DECREF(body);
        return NULL;
    }
    return Py_BuildValue("(NiN)", service, e->status, body);
}

static PyObject *lane_cache_get(LaneObject *self, PyObject *args) {
    const char *cid, *rq;
    Py_ssize_t cid_len, rq_len;
    double now;
    if (!PyArg_ParseTuple(args, "y#y#d:cache_get", &cid, &cid_len, &rq, &rq_len, &now))
        return NULL;
    if (isnan(now)) {
        PyErr_SetString(PyExc_ValueError, "Lane.cache_get: now is NaN");
        return NULL;
    }
    s0_rkey k;
    if (rkey_make(&k, cid, (size_t)cid_len, rq, (size_t)rq_len) < 0)
        return PyErr_NoMemory();
    int failed = 0;
    py_lock(self);
    s0_cent *e = cache_lookup(&self->cache, k.data, k.len, now);
    /* a copy, built into objects once the lock is released (a tuple's allocation may run the
     * collector, so any Python code, this lane's methods included) */
    s0_cent *copy = e != NULL ? cache_clone(e) : NULL;
    failed = e != NULL && copy == NULL;
    pthread_mutex_unlock(&self->mutex);
    rkey_free(&k);
    if (failed)
        return PyErr_NoMemory();
    if (copy == NULL)
        Py_RETURN_NONE;
    PyObject *out = cache_tuple(copy);
    free(copy);
    return out;
}

static PyObject *lane_cache_prune(LaneObject *self, PyObject *arg) {
    double now = PyFloat_AsDouble(arg);
    if (now == -1.0 && PyErr_Occurred())
        return NULL;
    if (isnan(now)) {
        PyErr_SetString(PyExc_ValueError, "Lane.cache_prune: now is NaN");
        return NULL;
    }
    py_lock(self);
    cache_prune(&self->cache, now);
    pthread_mutex_unlock(&self->mutex);
    Py_RETURN_NONE;
}

static PyObject *lane_cache_count(LaneObject *self, PyObject *unused) {
    (void)unused;
    py_lock(self);
    size_t n = self->cache.t.used;
    pthread_mutex_unlock(&self->mutex);
    return PyLong_FromSize_t(n);
}

static PyObject *lane_cache_bytes(LaneObject *self, PyObject *unused) {
    (void)unused;
    py_lock(self);
    size_t n = self->cache.bytes;
    pthread_mutex_unlock(&self->mutex);
    return PyLong_FromSize_t(n);
}

static PyObject *lane_cache_take(LaneObject *self, PyObject *unused) {
    (void)unused;
    py_lock(self);
    s0_cent *head = self->cache.head; /* taken whole: the cache starts empty */
    size_t n = self->cache.t.used;
    free(self->cache.t.slots);
    memset(&self->cache.t, 0, sizeof(self->cache.t));
    self->cache.head = self->cache.tail = NULL;
    self->cache.bytes = 0;
    pthread_mutex_unlock(&self->mutex);
    PyObject *out = PyList_New((Py_ssize_t)n);
    size_t i = 0;
    for (s0_cent *e = head, *next; e != NULL; e = next, i++) {
        next = e->next;
        if (out != NULL) {
            const unsigned char *c, *r;
            size_t c_len, r_len;
            rkey_split(e->key.data, e->key.len, &c, &c_len, &r, &r_len);
            PyObject *three = cache_tuple(e);
            PyObject *item =
                three == NULL
                    ? NULL
                    : Py_BuildValue("(y#y#OOOd)", (const char *)c, (Py_ssize_t)c_len,
                                    (const char *)r, (Py_ssize_t)r_len,
                                    PyTuple_GET_ITEM(three, 0), PyTuple_GET_ITEM(three, 1),
                                    PyTuple_GET_ITEM(three, 2), e->expires);
            Py_XDECREF(three);
            if (item == NULL)
                Py_CLEAR(out); /* (the entries are lost with the MemoryError) */
            else
                PyList_SET_ITEM(out, (Py_ssize_t)i, item);
        }
        free(e);
    }
    return out;
}

/* ---- the RequestDone ring, Python's side ------------------------------------------------ */

static PyObject *lane_serve_forwards(LaneObject *self, PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    py_lock(self);
    self->serve_forwards = on;
    pthread_mutex_unlock(&self->mutex);
    Py_RETURN_NONE;
}

static PyObject *lane_record_done(LaneObject *self, PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0)
        return NULL;
    py_lock(self);
    self->record_done = on;
    pthread_mutex_unlock(&self->mutex);
    Py_RETURN_NONE;
}

static PyObject *lane_done_capacity(LaneObject *self, PyObject *arg) {
    Py_ssize_t n = PyNumber_AsSsize_t(arg, PyExc_OverflowError);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 1) {
        PyErr_Format(PyExc_ValueError, "Lane.done_capacity: n must be >= 1, not %zd", n);
        return NULL;
    }
    py_lock(self);
    size_t held = self->done_n;
    if ((size_t)n < held) {
        pthread_mutex_unlock(&self->mutex);
        PyErr_Format(PyExc_ValueError,
                     "Lane.done_capacity: n (%zd) is smaller than the %zu records the ring holds "
                     "now (done_drain() first)",
                     n, held);
        return NULL;
    }
    self->done_limit = (size_t)n;
    pthread_mutex_unlock(&self->mutex);
    Py_RETURN_NONE;
}

static PyObject *lane_done_drain(LaneObject *self, PyObject *unused) {
    (void)unused;
    py_lock(self);
    PyObject *out = PyList_New((Py_ssize_t)self->done_n);
    if (out == NULL) {
        pthread_mutex_unlock(&self->mutex);
        return NULL;
    }
    for (size_t i = 0; i < self->done_n; i++) { /* every tuple made before the ring is emptied */
        const s0_done *d = self->done[(self->done_head + i) % self->done_cap];
        const char *service = (const char *)d->data;
        const char *via = service + d->service_len + d->wrid_len + d->crid_len;
        PyObject *t = Py_BuildValue(
            "(s#y#y#ddKKis#)", service, (Py_ssize_t)d->service_len, service + d->service_len,
            (Py_ssize_t)d->wrid_len, service + d->service_len + d->wrid_len,
            (Py_ssize_t)d->crid_len, d->started, d->finished, d->bytes_in, d->bytes_out,
            d->status, via, (Py_ssize_t)d->via_len);
        if (t == NULL) {
            pthread_mutex_unlock(&self->mutex);
            Py_DECREF(out);
            return NULL; /* (the ring unchanged) */
        }
        PyList_SET_ITEM(out, (Py_ssize_t)i, t);
    }
    for (size_t i = 0; i < self->done_n; i++)
        free(self->done[(self->done_head + i) % self->done_cap]);
    self->done_head = self->done_n = 0;
    if (self->done_cap > S0_DONE_KEEP) { /* a burst's slots go back */
        free(self->done);
        self->done = NULL;
        self->done_cap = 0;
    }
    pthread_mutex_unlock(&self->mutex);
    return out;
}

/* ---- phase 4b: the links, the peers, forwarding out (Python's side) ----------------------- */

static int links_on(const LaneObject *self, const char *method) {
    if (self->links)
        return 1;
    PyErr_Format(PyExc_ValueError,
                 "Lane.%s: this lane has no links (channel 3): make it with link_pipe", method);
    return 0;
}

/* A broker id argument: 1..255 bytes. */
static int broker_id_ok(Py_ssize_t len, const char *method, const char *what) {
    if (len >= 1 && len <= 255)
        return 1;
    PyErr_Format(PyExc_ValueError, "Lane.%s: %s must be 1..255 bytes, not %zd", method, what,
                 len);
    return 0;
}

static void wake(LaneObject *self) {
    uint64_t one = 1;
    ssize_t w = write(self->wake_fd, &one, sizeof(one));
    (void)w; /* EAGAIN: the counter is already set, the thread wakes anyway */
}

static PyObject *lane_add_link(LaneObject *self, PyObject *args) {
    const char *id;
    Py_ssize_t id_len;
    PyObject *handle;
    if (!PyArg_ParseTuple(args, "y#O:add_link", &id, &id_len, &handle) ||
        !links_on(self, "add_link") || !broker_id_ok(id_len, "add_link", "link_id"))
        return NULL;
    void *sock = handle_of(handle, "handle");
    if (sock == NULL)
        return NULL;
    s0_link *l = malloc(sizeof(s0_link) + (size_t)id_len);
    if (l == NULL)
        return PyErr_NoMemory();
    l->sock = sock;
    l->removing = 0;
    l->last_passed = 0;
    l->last_seen = 0.0;
    l->heard = 0;
    l->id_len = (size_t)id_len;
    memcpy(l->id, id, (size_t)id_len);
    const char *problem = NULL;
    py_lock(self);
    for (size_t i = 0; i < self->n_links && problem == NULL; i++)
        if (self->link_set[i]->id_len == l->id_len &&
            memcmp(self->link_set[i]->id, id, l->id_len) == 0)
            problem = "held";
    if (problem == NULL && self->n_links == self->links_cap) {
        size_t cap = self->links_cap ? 2 * self->links_cap : 8;
        s0_link **grown = realloc(self->link_set, cap * sizeof(*grown));
        if (grown == NULL) {
            problem = "memory";
        } else {
            self->link_set = grown;
            self->links_cap = cap;
        }
    }
    if (problem == NULL)
        self->link_set[self->n_links++] = l;
    pthread_mutex_unlock(&self->mutex);
    if (problem == NULL) {
        wake(self);
        Py_RETURN_NONE;
    }
    free(l);
    if (problem[0] == 'm')
        return PyErr_NoMemory();
    PyErr_Format(PyExc_ValueError,
                 "Lane.add_link: the lane holds a link %R already (remove_link it and wait for "
                 "released_links)",
                 PyTuple_GET_ITEM(args, 0));
    return NULL;
}

static PyObject *lane_remove_link(LaneObject *self, PyObject *arg) {
    if (!links_on(self, "remove_link"))
        return NULL;
    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "Lane.remove_link: link_id must be bytes, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    py_lock(self);
    s0_link *l = link_find(self, PyBytes_AS_STRING(arg), (size_t)PyBytes_GET_SIZE(arg));
    if (l != NULL)
        l->removing = 1;
    pthread_mutex_unlock(&self->mutex);
    if (l == NULL) {
        PyErr_Format(PyExc_KeyError, "Lane.remove_link: the lane holds no link %R", arg);
        return NULL;
    }
    wake(self);
    Py_RETURN_NONE;
}

static PyObject *lane_released_links(LaneObject *self, PyObject *unused) {
    (void)unused;
    if (!links_on(self, "released_links"))
        return NULL;
    py_lock(self);
    PyObject *out = PyList_New((Py_ssize_t)self->n_gone);
    for (size_t i = 0; out != NULL && i < self->n_gone; i++) {
        PyObject *b = PyBytes_FromStringAndSize((const char *)self->gone[i]->id,
                                                (Py_ssize_t)self->gone[i]->id_len);
        if (b == NULL)
            Py_CLEAR(out); /* (the list unchanged: listed next time) */
        else
            PyList_SET_ITEM(out, (Py_ssize_t)i, b);
    }
    if (out != NULL) {
        for (size_t i = 0; i < self->n_gone; i++)
            free(self->gone[i]);
        self->n_gone = 0;
    }
    pthread_mutex_unlock(&self->mutex);
    return out;
}

static PyObject *lane_peer(LaneObject *self, PyObject *args) {
    const char *id;
    Py_ssize_t id_len;
    int usable, forward_with;
    PyObject *free_of;
    if (!PyArg_ParseTuple(args, "y#ppO!:peer", &id, &id_len, &usable, &forward_with,
                          &PyDict_Type, &free_of) ||
        !broker_id_ok(id_len, "peer", "broker_id"))
        return NULL;
    /* The whole view made first: a bad entry changes nothing. */
    const unsigned char *bid = (const unsigned char *)id;
    s0_peer *p = record_new(sizeof(s0_peer), bid, (size_t)id_len, hash_bytes(bid, (size_t)id_len));
    if (p == NULL)
        return PyErr_NoMemory();
    memset(&p->free, 0, sizeof(p->free));
    p->usable = usable;
    p->forward_with = forward_with;
    PyObject *key, *value;
    Py_ssize_t pos = 0;
    while (PyDict_Next(free_of, &pos, &key, &value)) {
        if (!PyUnicode_Check(key) || !PyLong_Check(value)) {
            PyErr_Format(PyExc_TypeError,
                         "Lane.peer: free must be a dict of str (service) to int (free slots), "
                         "not %.100s: %.100s",
                         Py_TYPE(key)->tp_name, Py_TYPE(value)->tp_name);
            peer_free(p);
            return NULL;
        }
        long long n = PyLong_AsLongLong(value);
        Py_ssize_t len;
        const char *name = n == -1 && PyErr_Occurred() ? NULL : PyUnicode_AsUTF8AndSize(key, &len);
        s0_count *c = name != NULL ? count_make(&p->free, name, (size_t)len) : NULL;
        if (c == NULL) {
            if (!PyErr_Occurred())
                PyErr_NoMemory();
            peer_free(p);
            return NULL;
        }
        c->n = n;
    }
    int failed = 0;
    py_lock(self);
    size_t at;
    s0_peer *old = peer_find(self, id, (size_t)id_len, &at);
    if (old != NULL) {
        self->peers[at] = p; /* (its place in the order kept) */
    } else if (self->n_peers == self->peers_cap) {
        size_t cap = self->peers_cap ? 2 * self->peers_cap : 8;
        s0_peer **grown = realloc(self->peers, cap * sizeof(*grown));
        if (grown == NULL) {
            failed = 1;
        } else {
            self->peers = grown;
            self->peers_cap = cap;
        }
    }
    if (old == NULL && !failed)
        self->peers[self->n_peers++] = p;
    pthread_mutex_unlock(&self->mutex);
    peer_free(failed ? p : old);
    if (failed)
        return PyErr_NoMemory();
    Py_RETURN_NONE;
}

static PyObject *lane_forget_peer(LaneObject *self, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "Lane.forget_peer: broker_id must be bytes, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    py_lock(self);
    size_t at;
    s0_peer *p = peer_find(self, PyBytes_AS_STRING(arg), (size_t)PyBytes_GET_SIZE(arg), &at);
    if (p != NULL) {
        memmove(&self->peers[at], &self->peers[at + 1],
                (self->n_peers - at - 1) * sizeof(*self->peers));
        self->n_peers--;
    }
    pthread_mutex_unlock(&self->mutex);
    peer_free(p);
    Py_RETURN_NONE;
}

/* (broker id, service) of a delta's key: its bytes, then the service's. */
static int delta_order(const void *a, const void *b) {
    const s0_count *x = *(s0_count *const *)a, *y = *(s0_count *const *)b;
    const unsigned char *xp, *xs, *yp, *ys;
    size_t xpl, xsl, ypl, ysl;
    rkey_split(x->key.data, x->key.len, &xp, &xpl, &xs, &xsl);
    rkey_split(y->key.data, y->key.len, &yp, &ypl, &ys, &ysl);
    size_t n = xpl < ypl ? xpl : ypl;
    int c = n ? memcmp(xp, yp, n) : 0;
    if (c != 0)
        return c;
    if (xpl != ypl)
        return xpl < ypl ? -1 : 1;
    n = xsl < ysl ? xsl : ysl;
    c = n ? memcmp(xs, ys, n) : 0;
    if (c != 0)
        return c;
    return xsl < ysl ? -1 : xsl > ysl;
}

static PyObject *lane_peer_deltas(LaneObject *self, PyObject *unused) {
    (void)unused;
    py_lock(self);
    s0_table deltas = self->deltas; /* taken whole: the lane starts a new table */
    memset(&self->deltas, 0, sizeof(self->deltas));
    pthread_mutex_unlock(&self->mutex);
    s0_count **all = NULL;
    size_t n = 0;
    PyObject *out = NULL;
    if (table_list(&deltas, (void ***)&all, &n) < 0) {
        PyErr_NoMemory();
        goto done;
    }
    if (n > 1)
        qsort(all, n, sizeof(*all), delta_order);
    out = PyList_New(0);
    for (size_t i = 0; out != NULL && i < n; i++) {
        if (all[i]->n == 0)
            continue;
        const unsigned char *peer, *svc;
        size_t peer_len, svc_len;
        rkey_split(all[i]->key.data, all[i]->key.len, &peer, &peer_len, &svc, &svc_len);
        PyObject *item = Py_BuildValue("(y#NL)", (const char *)peer, (Py_ssize_t)peer_len,
                                       PyUnicode_DecodeUTF8((const char *)svc,
                                                            (Py_ssize_t)svc_len, "surrogatepass"),
                                       all[i]->n);
        if (item == NULL || PyList_Append(out, item) < 0)
            Py_CLEAR(out); /* (the deltas are lost with the MemoryError) */
        Py_XDECREF(item);
    }
done:
    free(all);
    table_free_all(&deltas);
    return out;
}

static PyObject *lane_forwarded_to(LaneObject *self, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "Lane.forwarded_to: broker_id must be bytes, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    const char *id = PyBytes_AS_STRING(arg);
    size_t len = (size_t)PyBytes_GET_SIZE(arg);
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    py_lock(self);
    for (size_t i = 0; out != NULL && i < self->n_heap; i++) {
        const s0_record *r = self->heap[i];
        if (r->out && r->peer_len == len && memcmp(r->peer, id, len) == 0 &&
            dict_count(out, PyUnicode_DecodeUTF8((const char *)r->service,
                                                 (Py_ssize_t)r->service_len, "surrogatepass")) < 0)
            Py_CLEAR(out);
    }
    pthread_mutex_unlock(&self->mutex);
    return out;
}

static PyObject *lane_identity(LaneObject *self, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "Lane.identity: name must be bytes, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    if (!broker_id_ok(PyBytes_GET_SIZE(arg), "identity", "name"))
        return NULL;
    py_lock(self);
    self->identity_len = (size_t)PyBytes_GET_SIZE(arg);
    memcpy(self->identity, PyBytes_AS_STRING(arg), self->identity_len);
    pthread_mutex_unlock(&self->mutex);
    Py_RETURN_NONE;
}

static PyObject *lane_adopt_peer(LaneObject *self, PyObject *arg) {
    if (!PyBytes_Check(arg)) {
        PyErr_Format(PyExc_TypeError, "Lane.adopt_peer: broker_id must be bytes, not %.100s",
                     Py_TYPE(arg)->tp_name);
        return NULL;
    }
    return adopt_many(self, ADOPT_PEER, PyBytes_AS_STRING(arg), (size_t)PyBytes_GET_SIZE(arg),
                      0.0);
}

static PyMethodDef lane_methods[] = {
    {"start", (PyCFunction)lane_start, METH_NOARGS, "start(): spawn the lane thread (once)"},
    {"stop", (PyCFunction)lane_stop, METH_NOARGS,
     "stop(): idempotent; forward Python's pending sends, stop and join the thread"},
    {"configure", (PyCFunction)lane_configure, METH_VARARGS,
     "configure(config_version, max_skew_s): the running config's version and R12 limit"},
    {"note", (PyCFunction)(void (*)(void))lane_note, METH_VARARGS | METH_KEYWORDS,
     "note(channel, routing_id, promise_ms, gap_s, last_seen, majordomo=0, client_id=b'', "
     "open=True): insert or update a session; majordomo: 0 (S0P) or its Majordomo reading; "
     "on channel 2 (the peer ROUTER) client_id is the peer's broker_id (1..255 bytes)"},
    {"forget", (PyCFunction)lane_forget, METH_VARARGS, "forget(channel, routing_id)"},
    {"clear", (PyCFunction)lane_clear, METH_NOARGS, "clear(): forget every session"},
    {"negotiated", (PyCFunction)lane_negotiated, METH_VARARGS,
     "negotiated(channel, fd): the connection negotiated (R20)"},
    {"gone", (PyCFunction)lane_gone, METH_VARARGS, "gone(channel, fd): the connection closed"},
    {"heard", (PyCFunction)lane_heard, METH_NOARGS,
     "heard() -> [(channel, routing_id, last_seen)] raised by what the lane took (beats, "
     "requests, replies, forwards), once each"},
    {"last_seen", (PyCFunction)lane_last_seen, METH_VARARGS,
     "last_seen(channel, routing_id) -> float | None"},
    {"stats", (PyCFunction)lane_stats, METH_NOARGS, "stats() -> dict of counters"},
    {"lock", (PyCFunction)lane_lock, METH_NOARGS,
     "lock(): take the lane's lock (recursive), the GIL released while waiting"},
    {"unlock", (PyCFunction)lane_unlock, METH_NOARGS,
     "unlock(): release one lock(); RuntimeError without one"},
    {"attach_pool", (PyCFunction)lane_attach_pool, METH_O,
     "attach_pool(pool): share a scale0.core._pool.Pool with the lane (None detaches)"},
    {"serve", (PyCFunction)lane_serve, METH_VARARGS,
     "serve(on, timeout_s, max_per_client, ticket_prefix, max_queued, may_queue): whether and "
     "how the lane takes "
     "Majordomo requests"},
    {"python_waits", (PyCFunction)lane_python_waits, METH_VARARGS,
     "python_waits(service, count): how many requests of service wait in Python (R6)"},
    {"python_holds", (PyCFunction)lane_python_holds, METH_VARARGS,
     "python_holds(client_id, count): how many requests of this client Python holds"},
    {"adopt", (PyCFunction)lane_adopt, METH_O, "adopt(ticket) -> record | None"},
    {"adopt_worker", (PyCFunction)lane_adopt_worker, METH_O,
     "adopt_worker(routing_id) -> [record]: the worker's, in ticket order"},
    {"adopt_all", (PyCFunction)lane_adopt_all, METH_NOARGS,
     "adopt_all() -> [record]: in flight in ticket order, then waiting in seq order"},
    {"adopt_due", (PyCFunction)lane_adopt_due, METH_O,
     "adopt_due(now) -> [record]: those with deadline <= now, in (deadline, seq) order"},
    {"next_due", (PyCFunction)lane_next_due, METH_NOARGS,
     "next_due() -> float | None: the earliest deadline the lane holds"},
    {"held", (PyCFunction)lane_held, METH_O, "held(client_id) -> int: the lane's requests of it"},
    {"busy", (PyCFunction)lane_busy, METH_O,
     "busy(client_rid) -> bool: the lane holds a request from this routing id"},
    {"in_flight", (PyCFunction)lane_in_flight, METH_NOARGS,
     "in_flight() -> int: the lane's requests in flight (not waiting)"},
    {"waiting_head", (PyCFunction)lane_waiting_head, METH_O,
     "waiting_head(service) -> record | None: the head of the lane's queue, not removed"},
    {"dispatch_head", (PyCFunction)lane_dispatch_head, METH_VARARGS,
     "dispatch_head(service, ticket, worker_rid): the queue's head is in flight there under "
     "Python's ticket (KeyError if the queue is empty)"},
    {"adopt_next_waiting", (PyCFunction)lane_adopt_next_waiting, METH_O,
     "adopt_next_waiting(service) -> record | None: the queue's head, handed over"},
    {"adopt_waiting", (PyCFunction)lane_adopt_waiting, METH_O,
     "adopt_waiting(service) -> [record]: the whole queue, in order"},
    {"waiting", (PyCFunction)lane_waiting, METH_O, "waiting(service) -> int"},
    {"waiting_total", (PyCFunction)lane_waiting_total, METH_NOARGS, "waiting_total() -> int"},
    {"open_by_connection", (PyCFunction)lane_open_by_connection, METH_NOARGS,
     "open_by_connection() -> {client_rid: requests}: in flight and waiting"},
    {"held_by_client", (PyCFunction)lane_held_by_client, METH_NOARGS,
     "held_by_client() -> {client_id: requests}: in flight and waiting"},
    {"held_from", (PyCFunction)lane_held_from, METH_O,
     "held_from(via) -> {service: requests}: the FORWARDs of peer `via` the lane holds (F16)"},
    {"next_seq", (PyCFunction)lane_next_seq, METH_NOARGS,
     "next_seq() -> int: the shared request numbering's next value"},
    {"seq_from", (PyCFunction)lane_seq_from, METH_O,
     "seq_from(n): raise the numbering to at least n"},
    {"drain", (PyCFunction)lane_drain, METH_NOARGS,
     "drain() -> (requests, replies, [(service, status, counts, sum_s)], changed, forwards, "
     "forwarded): "
     "since the last one"},
    {"python_key", (PyCFunction)lane_python_key, METH_VARARGS,
     "python_key(client_id, request_id, live): Python holds (True) / no longer holds (False) a "
     "request not answered yet under this key (R10)"},
    {"python_keys", (PyCFunction)lane_python_keys, METH_NOARGS,
     "python_keys() -> int: how many keys Python told as live"},
    {"adopt_key", (PyCFunction)lane_adopt_key, METH_VARARGS,
     "adopt_key(client_id, request_id) -> record | None: the lane's S0P record of that key"},
    {"cache_limits", (PyCFunction)lane_cache_limits, METH_VARARGS,
     "cache_limits(max_entries, max_bytes, max_age_s): the reply cache's bounds"},
    {"cache_put", (PyCFunction)lane_cache_put, METH_VARARGS,
     "cache_put(client_id, request_id, service, status, body, expires): ReplyCache.put"},
    {"cache_get", (PyCFunction)lane_cache_get, METH_VARARGS,
     "cache_get(client_id, request_id, now) -> (service, status, body) | None"},
    {"cache_prune", (PyCFunction)lane_cache_prune, METH_O,
     "cache_prune(now): drop from the oldest while expired"},
    {"cache_count", (PyCFunction)lane_cache_count, METH_NOARGS, "cache_count() -> int"},
    {"cache_bytes", (PyCFunction)lane_cache_bytes, METH_NOARGS,
     "cache_bytes() -> int: the body bytes the cache holds"},
    {"cache_take", (PyCFunction)lane_cache_take, METH_NOARGS,
     "cache_take() -> [(client_id, request_id, service, status, body, expires)]: every entry, "
     "oldest first; the cache emptied"},
    {"serve_forwards", (PyCFunction)lane_serve_forwards, METH_O,
     "serve_forwards(on): while on (and serve on), the lane may take a peer's FORWARD on "
     "channel 2"},
    {"record_done", (PyCFunction)lane_record_done, METH_O,
     "record_done(on): while on, every final REPLY the lane takes appends a RequestDone "
     "record to the ring"},
    {"done_capacity", (PyCFunction)lane_done_capacity, METH_O,
     "done_capacity(n): the ring's bound (default 65536); full, a REPLY goes to Python"},
    {"done_drain", (PyCFunction)lane_done_drain, METH_NOARGS,
     "done_drain() -> [(service, worker_rid, client_rid, started, finished, bytes_in, "
     "bytes_out, status, via)]: in the order taken; the ring emptied"},
    {"add_link", (PyCFunction)lane_add_link, METH_VARARGS,
     "add_link(link_id, handle): the lane becomes the only user of this link DEALER (channel 3)"},
    {"remove_link", (PyCFunction)lane_remove_link, METH_O,
     "remove_link(link_id): the lane lets it go at its next wake-up (see released_links)"},
    {"released_links", (PyCFunction)lane_released_links, METH_NOARGS,
     "released_links() -> [link_id]: links the lane let go since the last call (close them)"},
    {"peer", (PyCFunction)lane_peer, METH_VARARGS,
     "peer(broker_id, usable, forward_with, free): insert or replace the lane's view of a peer"},
    {"forget_peer", (PyCFunction)lane_forget_peer, METH_O, "forget_peer(broker_id)"},
    {"peer_deltas", (PyCFunction)lane_peer_deltas, METH_NOARGS,
     "peer_deltas() -> [(broker_id, service, delta)]: how the lane moved the free counts"},
    {"forwarded_to", (PyCFunction)lane_forwarded_to, METH_O,
     "forwarded_to(broker_id) -> {service: requests}: the lane's records in flight there"},
    {"identity", (PyCFunction)lane_identity, METH_O,
     "identity(name): this broker's id (a FORWARD's origin_broker)"},
    {"adopt_peer", (PyCFunction)lane_adopt_peer, METH_O,
     "adopt_peer(broker_id) -> [record]: every record forwarded to that peer, ticket order"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject LaneType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "scale0.net._zmqio.Lane",
    .tp_doc = "The C lane: owns the broker's ROUTERs, answers plain HEARTBEATs, dispatches "
              "Majordomo requests "
              "(see scale0/net/_lane.c)",
    .tp_basicsize = sizeof(LaneObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = lane_new,
    .tp_dealloc = (destructor)lane_dealloc,
    .tp_methods = lane_methods,
};

int s0_lane_add(void *module) {
    s0_hash_seed();
    if (PyType_Ready(&LaneType) < 0)
        return -1;
    Py_INCREF(&LaneType);
    if (PyModule_AddObject((PyObject *)module, "Lane", (PyObject *)&LaneType) < 0) {
        Py_DECREF(&LaneType);
        return -1;
    }
    return 0;
}
