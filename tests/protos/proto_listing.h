#pragma once
// What decides the wire of a .proto file, as plain text: its package, every message's fields
// (number, name, type, label, message or enum type), enums' values and services' methods (streaming
// included). Comments, options and file names are left out. Two files with the same listing
// speak the same wire: how our own copies of the kubelet's APIs are checked against upstream's.

#include <google/protobuf/descriptor.h>

#include <string>

namespace tessera::test {

std::string ProtoListing(const google::protobuf::FileDescriptor& file);

}  // namespace tessera::test
