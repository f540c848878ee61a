// src/boost_ssl_impl.cpp — Boost.Asio's SSL functions, compiled once (see
// boost_impl.cpp), in their own target fairgate_asio_ssl so that only what
// speaks TLS (the Redis client) links OpenSSL.
#include <boost/asio/ssl/impl/src.hpp>
