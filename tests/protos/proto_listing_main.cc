// Prints the wire listing (proto_listing.h) of every file in a descriptor set, as protoc writes
// one: how tests/protos/upstream.txt was made from the kubelet's upstream .proto files.
//   protoc -I <kubelet>/pkg/apis --descriptor_set_out=up.pb <the five api.proto files>
//   proto_listing up.pb > tests/protos/upstream.txt
#include <google/protobuf/descriptor.pb.h>

#include <fstream>
#include <iostream>

#include "proto_listing.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::cerr << "usage: proto_listing DESCRIPTOR_SET\n";
    return 2;
  }
  std::ifstream in(argv[1], std::ios::binary);
  google::protobuf::FileDescriptorSet set;
  if (!in || !set.ParseFromIstream(&in)) {
    std::cerr << "proto_listing: " << argv[1] << ": not a descriptor set\n";
    return 1;
  }
  google::protobuf::DescriptorPool pool;
  for (const auto& f : set.file()) {
    const google::protobuf::FileDescriptor* d = pool.BuildFile(f);
    if (d == nullptr) {
      std::cerr << "proto_listing: " << f.name() << ": does not build\n";
      return 1;
    }
    std::cout << "# " << f.name() << "\n" << tessera::test::ProtoListing(*d);
  }
  return 0;
}
