#include "support/test_pki.hpp"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace fairgate::test {

TestPki::TestPki() {
  char tmpl[] = "/tmp/fairgate-pki-XXXXXX";
  if (!::mkdtemp(tmpl)) throw std::runtime_error("mkdtemp failed");
  dir_ = tmpl;
  const std::string key = "openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out ";
  for (const char* ca : {"ca", "other-ca"}) {
    run(key + file(std::string(ca) + ".key"));
    run("openssl req -x509 -new -key " + file(std::string(ca) + ".key") +
        " -days 2 -subj /CN=fairgate-test-" + ca + " -out " + file(std::string(ca) + ".crt"));
  }
  make_cert("server", "ca", "localhost", "IP:127.0.0.1,DNS:localhost");
  make_cert("client", "ca", "fairgate-test-client", "DNS:fairgate-test-client");
  make_cert("wrongname", "ca", "wrong.example", "DNS:wrong.example");
  make_cert("foreign", "other-ca", "localhost", "IP:127.0.0.1,DNS:localhost");
}

TestPki::~TestPki() {
  std::error_code ec;
  std::filesystem::remove_all(dir_, ec);
}

void TestPki::run(const std::string& command) const {
  const std::string full = command + " >>" + file("openssl.log") + " 2>&1";
  if (std::system(full.c_str()) != 0)
    throw std::runtime_error("failed: " + command + " (is the openssl package installed? see " +
                             file("openssl.log") + ")");
}

void TestPki::make_cert(const std::string& name, const std::string& ca, const std::string& cn,
                        const std::string& san) const {
  const std::string ext = file(name + ".ext");
  std::ofstream(ext) << "subjectAltName=" << san << "\nbasicConstraints=CA:FALSE\n";
  run("openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out " + file(name + ".key"));
  run("openssl req -new -key " + file(name + ".key") + " -subj /CN=" + cn + " -out " + file(name + ".csr"));
  run("openssl x509 -req -in " + file(name + ".csr") + " -CA " + file(ca + ".crt") + " -CAkey " +
      file(ca + ".key") + " -CAcreateserial -days 2 -extfile " + ext + " -out " + file(name + ".crt"));
}

}  // namespace fairgate::test
