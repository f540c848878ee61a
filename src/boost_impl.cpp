// src/boost_impl.cpp — the one translation unit that compiles Boost.Asio's
// and Boost.Beast's non-inline functions (Asio's SSL part: boost_ssl_impl.cpp).
// Every target that includes them links fairgate_asio, which defines
// BOOST_ASIO_SEPARATE_COMPILATION and BOOST_BEAST_SEPARATE_COMPILATION, so
// the other translation units only declare those functions instead of
// compiling them again: a third off the compile time of a file that uses
// Asio (src/serve/server.cpp: 40 s → 27 s on the 2-core machine), and off
// every build in CI.
#include <boost/asio/impl/src.hpp>
#include <boost/beast/src.hpp>
