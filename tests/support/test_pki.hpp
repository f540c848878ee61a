// tests/support/test_pki.hpp — throwaway certificates for the TLS tests, made
// at test time with the openssl CLI in a temporary directory (never committed):
//
//   ca.crt / ca.key             the test CA
//   server.crt / server.key     signed by ca, for 127.0.0.1 and localhost (SAN)
//   client.crt / client.key     signed by ca (mutual TLS)
//   wrongname.crt / .key        signed by ca, for wrong.example only
//   other-ca.crt                another CA
//   foreign.crt / foreign.key   signed by other-ca, for 127.0.0.1 and localhost
//
// EC P-256 keys (fast to make). The directory is removed on destruction.
#pragma once

#include <string>

namespace fairgate::test {

class TestPki {
 public:
  TestPki();
  ~TestPki();
  TestPki(const TestPki&) = delete;
  TestPki& operator=(const TestPki&) = delete;

  const std::string& dir() const { return dir_; }
  /// dir() + "/" + name, e.g. file("ca.crt").
  std::string file(const std::string& name) const { return dir_ + "/" + name; }

 private:
  void run(const std::string& command) const;
  void make_cert(const std::string& name, const std::string& ca, const std::string& cn,
                 const std::string& san) const;
  std::string dir_;
};

}  // namespace fairgate::test
