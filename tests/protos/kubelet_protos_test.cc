// Our own .proto copies of the kubelet's gRPC APIs speak upstream's wire: the listing of each
// compiled file (package, messages, field numbers, names, types, labels, enums, methods) equals
// the one made from kubernetes/kubelet's own files (upstream.txt; how it was made is in its
// header).
#include <gtest/gtest.h>

#include <sstream>

#include "../capture.h"
#include "deviceplugin/v1beta1/api.pb.h"
#include "dra-health/v1/api.pb.h"
#include "dra/v1/api.pb.h"
#include "pluginregistration/v1/api.pb.h"
#include "podresources/v1/api.pb.h"
#include "proto_listing.h"

namespace {

TEST(KubeletProtos, OurCopiesSpeakUpstreamsWire) {
  // Each file once, through a message of it (a static library links only what is used).
  const google::protobuf::FileDescriptor* files[] = {
      v1beta1::AllocateRequest::descriptor()->file(),
      v1::ListPodResourcesRequest::descriptor()->file(),
      k8s::io::kubelet::pkg::apis::dra::v1::Claim::descriptor()->file(),
      v1::NodeWatchResourcesRequest::descriptor()->file(),
      pluginregistration::PluginInfo::descriptor()->file()};
  std::string ours;
  for (const auto* f : files) ours += "# " + f->name() + "\n" + tessera::test::ProtoListing(*f);
  std::istringstream in(tessera::test::ReadFile(TESSERA_SOURCE_DIR "/tests/protos/upstream.txt"));
  std::string upstream, line;
  while (std::getline(in, line)) {
    if (!line.starts_with("## ")) upstream += line + "\n";  // "## " lines: the header
  }
  ASSERT_FALSE(upstream.empty());
  EXPECT_EQ(ours, upstream);
}

}  // namespace
