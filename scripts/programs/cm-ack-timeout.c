/* rdma_set_option(RDMA_OPTION_ID_ACK_TIMEOUT) end to end: the client sets
 * its connection's local ACK timeout before connecting (as SPDK's NVMe-oF
 * initiator does), and both QPs, once connected, report it: the client's
 * because it set it, the server's because the kernel's CM takes the
 * REQ's local ACK timeout for the passive side too. A value past 31 is
 * refused.
 *
 *   cm-ack-timeout -s ADDR PORT            # prints "server timeout N"
 *   cm-ack-timeout -c ADDR PORT TIMEOUT    # prints "client timeout N"
 *
 * Built and run by scripts/stack-matrix.py over softrnic's librdmacm. */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <rdma/rdma_cma.h>

static void die(const char *what)
{
	fprintf(stderr, "%s: %s\n", what, strerror(errno));
	exit(1);
}

static struct rdma_cm_event *expect(struct rdma_event_channel *channel, enum rdma_cm_event_type type)
{
	struct rdma_cm_event *event;

	if (rdma_get_cm_event(channel, &event))
		die("rdma_get_cm_event");
	if (event->event != type) {
		fprintf(stderr, "got %s, wanted %s\n", rdma_event_str(event->event), rdma_event_str(type));
		exit(1);
	}
	return event;
}

static void make_qp(struct rdma_cm_id *id)
{
	struct ibv_qp_init_attr init = {
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};

	if (rdma_create_qp(id, NULL, &init))
		die("rdma_create_qp");
}

static int qp_timeout(struct rdma_cm_id *id)
{
	struct ibv_qp_attr attr;
	struct ibv_qp_init_attr init;

	if (ibv_query_qp(id->qp, &attr, IBV_QP_TIMEOUT, &init))
		die("ibv_query_qp");
	return attr.timeout;
}

static struct addrinfo *address(const char *host, const char *port)
{
	struct addrinfo hints = { .ai_family = AF_INET }, *res;

	if (getaddrinfo(host, port, &hints, &res))
		die("getaddrinfo");
	return res;
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *channel;
	struct rdma_cm_id *id, *child;
	struct rdma_cm_event *event;
	struct rdma_conn_param param = { .responder_resources = 1, .initiator_depth = 1, .retry_count = 7 };
	struct addrinfo *addr;

	if (argc < 4 || (argv[1][1] == 'c' && argc < 5)) {
		fprintf(stderr, "usage: %s -s ADDR PORT | -c ADDR PORT TIMEOUT\n", argv[0]);
		return 2;
	}
	channel = rdma_create_event_channel();
	if (!channel || rdma_create_id(channel, &id, NULL, RDMA_PS_TCP))
		die("rdma_create_id");
	addr = address(argv[2], argv[3]);
	if (argv[1][1] == 's') {
		if (rdma_bind_addr(id, addr->ai_addr) || rdma_listen(id, 1))
			die("listen");
		event = expect(channel, RDMA_CM_EVENT_CONNECT_REQUEST);
		child = event->id;
		rdma_ack_cm_event(event);
		make_qp(child);
		if (rdma_accept(child, &param))
			die("rdma_accept");
		rdma_ack_cm_event(expect(channel, RDMA_CM_EVENT_ESTABLISHED));
		printf("server timeout %d\n", qp_timeout(child));
		rdma_ack_cm_event(expect(channel, RDMA_CM_EVENT_DISCONNECTED));
		return 0;
	}
	uint8_t timeout = 32;
	if (rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &timeout, sizeof(timeout)) == 0 ||
	    errno != EINVAL) {
		fprintf(stderr, "an ACK timeout of 32 was not refused with EINVAL\n");
		return 1;
	}
	timeout = (uint8_t)atoi(argv[4]);
	if (rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_ACK_TIMEOUT, &timeout, sizeof(timeout)))
		die("rdma_set_option");
	if (rdma_resolve_addr(id, NULL, addr->ai_addr, 2000))
		die("rdma_resolve_addr");
	rdma_ack_cm_event(expect(channel, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(id, 2000))
		die("rdma_resolve_route");
	rdma_ack_cm_event(expect(channel, RDMA_CM_EVENT_ROUTE_RESOLVED));
	make_qp(id);
	if (rdma_connect(id, &param))
		die("rdma_connect");
	rdma_ack_cm_event(expect(channel, RDMA_CM_EVENT_ESTABLISHED));
	printf("client timeout %d\n", qp_timeout(id));
	/* A CM in the process sends what the program leaves only while the
	 * process lives: wait for the disconnect to be answered. */
	if (rdma_disconnect(id))
		die("rdma_disconnect");
	rdma_ack_cm_event(expect(channel, RDMA_CM_EVENT_DISCONNECTED));
	return 0;
}
