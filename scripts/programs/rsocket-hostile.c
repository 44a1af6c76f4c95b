/* An rsocket server against a peer that does not speak rsockets: the
 * client here makes its connections with plain rdma_cm and verbs. A
 * connection request whose private data is not an rsocket's (another
 * version) is refused, and raccept says so without taking the next one;
 * a connection whose peer then SENDs a message of no kind rsockets know
 * ends the server's rrecv with EPROTO, and nothing crashes or hangs.
 *
 *   rsocket-hostile -s ADDR PORT     # the rsocket server: prints "hostile peer refused: N checks"
 *   rsocket-hostile -c ADDR PORT     # the peer that breaks the rules
 *
 * Built and run by scripts/stack-matrix.py over softrnic's librdmacm. */
#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>

#include "check.h"

static void server(const char *ip, int port)
{
	struct sockaddr_in sin = address(ip, port);
	char buf[64];
	int l, s;

	l = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(l >= 0, "rsocket");
	CHECK(!rbind(l, (struct sockaddr *)&sin, sizeof sin), "rbind");
	CHECK(!rlisten(l, 4), "rlisten");
	errno = 0;
	CHECK(raccept(l, NULL, NULL) == -1 && errno == ECONNABORTED,
	      "a request with another protocol version is refused");
	s = raccept(l, NULL, NULL);
	CHECK(s >= 0, "a request with an rsocket's private data is accepted");
	errno = 0;
	CHECK(rrecv(s, buf, sizeof buf, 0) == -1 && errno == EPROTO, "a message of no known kind is EPROTO");
	errno = 0;
	CHECK(rrecv(s, buf, sizeof buf, 0) == -1 && errno == EPROTO, "and stays so");
	CHECK(!rclose(s), "rclose");
	CHECK(!rclose(l), "rclose the listener");
	printf("hostile peer refused: %d checks\n", checks);
}

static struct rdma_cm_event *expect(struct rdma_event_channel *channel, enum rdma_cm_event_type type)
{
	struct rdma_cm_event *event;

	CHECK(!rdma_get_cm_event(channel, &event), "rdma_get_cm_event");
	CHECK(event->event == type, "got %s, wanted %s", rdma_event_str(event->event), rdma_event_str(type));
	return event;
}

/* An rsocket's 24-byte hello (crates/rdmacm/src/rsocket/message.rs),
 * with protocol version `version`, naming no credit word. */
static void hello(uint8_t *bytes, uint8_t version)
{
	uint32_t slot = htonl(16384), slots = htonl(16);

	memset(bytes, 0, 24);
	bytes[0] = version;
	memcpy(bytes + 4, &slot, 4);
	memcpy(bytes + 8, &slots, 4);
}

/* Connects to the server with `version` in the hello; returns the ID once
 * ESTABLISHED, or NULL once REJECTED. */
static struct rdma_cm_id *connect_with(struct rdma_event_channel *channel, struct sockaddr_in *sin, uint8_t version,
				       struct ibv_pd **pd, struct ibv_cq **cq)
{
	struct rdma_cm_id *id;
	struct rdma_cm_event *event;
	uint8_t data[24];
	struct rdma_conn_param param = { .private_data = data, .private_data_len = sizeof data,
					 .responder_resources = 1, .initiator_depth = 1, .retry_count = 7,
					 .rnr_retry_count = 7 };

	hello(data, version);
	CHECK(!rdma_create_id(channel, &id, NULL, RDMA_PS_TCP), "rdma_create_id");
	CHECK(!rdma_resolve_addr(id, NULL, (struct sockaddr *)sin, 2000), "rdma_resolve_addr");
	rdma_ack_cm_event(expect(channel, RDMA_CM_EVENT_ADDR_RESOLVED));
	CHECK(!rdma_resolve_route(id, 2000), "rdma_resolve_route");
	rdma_ack_cm_event(expect(channel, RDMA_CM_EVENT_ROUTE_RESOLVED));
	*pd = ibv_alloc_pd(id->verbs);
	*cq = ibv_create_cq(id->verbs, 8, NULL, NULL, 0);
	CHECK(*pd && *cq, "ibv_alloc_pd, ibv_create_cq");
	struct ibv_qp_init_attr init = {
		.send_cq = *cq, .recv_cq = *cq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	CHECK(!rdma_create_qp(id, *pd, &init), "rdma_create_qp");
	CHECK(!rdma_connect(id, &param), "rdma_connect");
	CHECK(!rdma_get_cm_event(channel, &event), "rdma_get_cm_event");
	if (event->event == RDMA_CM_EVENT_REJECTED) {
		rdma_ack_cm_event(event);
		return NULL;
	}
	CHECK(event->event == RDMA_CM_EVENT_ESTABLISHED, "got %s", rdma_event_str(event->event));
	rdma_ack_cm_event(event);
	return id;
}

static void client(const char *ip, int port)
{
	struct sockaddr_in sin = address(ip, port);
	struct rdma_event_channel *channel = rdma_create_event_channel();
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_wc wc;
	struct rdma_cm_id *id;
	char *junk;

	CHECK(channel, "rdma_create_event_channel");
	CHECK(!connect_with(channel, &sin, 9, &pd, &cq), "the server refuses protocol version 9");
	id = connect_with(channel, &sin, 1, &pd, &cq);
	CHECK(id, "the server accepts protocol version 1");

	/* A SEND whose immediate names no kind (0x7f), from heap memory
	 * (softrnicd shares a program's pages, which its stack's are not). */
	CHECK(!posix_memalign((void **)&junk, 4096, 4096), "posix_memalign");
	strcpy(junk, "garbage");
	struct ibv_mr *mr = ibv_reg_mr(pd, junk, 4096, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr, "ibv_reg_mr");
	struct ibv_sge sge = { .addr = (uintptr_t)junk, .length = 8, .lkey = mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 1, .sg_list = &sge, .num_sge = 1, .opcode = IBV_WR_SEND_WITH_IMM,
				  .send_flags = IBV_SEND_SIGNALED, .imm_data = htonl(0x7f000000) }, *bad;
	CHECK(!ibv_post_send(id->qp, &wr, &bad), "ibv_post_send");
	int n;
	while ((n = ibv_poll_cq(cq, 1, &wc)) == 0)
		;
	CHECK(n == 1 && wc.status == IBV_WC_SUCCESS, "the SEND completed (status %d)", wc.status);

	/* The server closes once it has seen the message for what it is. */
	rdma_ack_cm_event(expect(channel, RDMA_CM_EVENT_DISCONNECTED));
	printf("client: %d checks\n", checks);
}

int main(int argc, char **argv)
{
	if (argc < 4 || (strcmp(argv[1], "-s") && strcmp(argv[1], "-c"))) {
		fprintf(stderr, "usage: %s -s|-c ADDR PORT\n", argv[0]);
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (!strcmp(argv[1], "-s"))
		server(argv[2], atoi(argv[3]));
	else
		client(argv[2], atoi(argv[3]));
	return 0;
}
