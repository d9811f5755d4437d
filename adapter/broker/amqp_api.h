/*
 * amqp_api — rabbitmq-c's headers, wherever the installed rabbitmq-c keeps them. 0.12 moved
 * them to <rabbitmq-c/...> and made the old names (<amqp.h>, <amqp_tcp_socket.h>,
 * <amqp_ssl_socket.h>) warn that they are deprecated, which -Werror turns into a failed build;
 * Debian 12's 0.11 has only the old names. Everything in idemq includes rabbitmq-c through here.
 */
#ifndef IDEMQ_BROKER_AMQP_API_H
#define IDEMQ_BROKER_AMQP_API_H

#if defined(__has_include)
#if __has_include(<rabbitmq-c/amqp.h>)
#define IDEMQ_RABBITMQ_C_HEADERS_DIR 1
#endif
#endif

#ifdef IDEMQ_RABBITMQ_C_HEADERS_DIR
#include <rabbitmq-c/amqp.h>
#include <rabbitmq-c/ssl_socket.h>
#include <rabbitmq-c/tcp_socket.h>
#else
#include <amqp.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#endif

#endif
