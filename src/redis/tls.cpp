#include "redis/tls.hpp"

namespace fairgate::redis {

std::variant<std::shared_ptr<boost::asio::ssl::context>, std::string> make_tls_context(
    const TlsOptions& tls) {
  return fairgate::tls::make_context(tls);
}

std::string prepare_tls_stream(TlsStream& tls, const Endpoint& endpoint) {
  auto problem = fairgate::tls::prepare(tls.stream.native_handle(), tls.check, endpoint.host, endpoint.tls);
  if (problem.empty() && endpoint.tls.verify)
    tls.stream.set_verify_callback(fairgate::tls::remember_rejection(tls.check));
  return problem;
}

std::string describe_handshake_failure(TlsStream& tls, const Endpoint& endpoint,
                                       const boost::system::error_code& ec) {
  return fairgate::tls::describe_handshake_failure(tls.stream.native_handle(), tls.check, endpoint.host,
                                                   endpoint.port, endpoint.tls, ec);
}

}  // namespace fairgate::redis
