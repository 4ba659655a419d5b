#pragma once
// Tests' client of the fake API server (tests/fakes/apiserver), as "tester" (its test token).

#include <memory>

#include "fake_apiserver.h"
#include "tessera/kube/client.h"

namespace tessera::kube::testing {

inline std::unique_ptr<Client> ConnectTo(const fakes::FakeApiServer& api) {
  ClusterConfig c;
  c.server = api.url();
  c.token = "test-token";
  c.ca_pem = api.ca_pem();
  return std::move(*Client::Create(c));
}

}  // namespace tessera::kube::testing
