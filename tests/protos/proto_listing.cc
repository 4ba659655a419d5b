#include "proto_listing.h"

#include <google/protobuf/descriptor.pb.h>

#include <algorithm>
#include <vector>

namespace tessera::test {
namespace {

using google::protobuf::Descriptor;
using google::protobuf::EnumDescriptor;
using google::protobuf::FieldDescriptor;

void Enum(const EnumDescriptor& e, std::vector<std::string>& out) {
  for (int i = 0; i < e.value_count(); ++i) {
    out.push_back("enum " + e.full_name() + " " + e.value(i)->name() + " = " +
                  std::to_string(e.value(i)->number()));
  }
}

void Message(const Descriptor& m, std::vector<std::string>& out) {
  out.push_back("message " + m.full_name());
  for (int i = 0; i < m.field_count(); ++i) {
    const FieldDescriptor& f = *m.field(i);
    std::string type = f.type_name();
    if (f.message_type()) type = f.message_type()->full_name();
    if (f.enum_type()) type = f.enum_type()->full_name();
    std::string label = f.is_repeated()                         ? "repeated"
                        : f.has_presence() && !f.message_type() ? "optional"
                                                                : "singular";
    if (f.is_map()) label = "map";
    out.push_back("field " + m.full_name() + " " + std::to_string(f.number()) + " " + f.name() +
                  " " + label + " " + type);
  }
  for (int i = 0; i < m.nested_type_count(); ++i) {
    if (!m.nested_type(i)->options().map_entry()) Message(*m.nested_type(i), out);
  }
  for (int i = 0; i < m.enum_type_count(); ++i) Enum(*m.enum_type(i), out);
}

}  // namespace

std::string ProtoListing(const google::protobuf::FileDescriptor& file) {
  std::vector<std::string> lines;
  lines.push_back("package " + file.package());
  for (int i = 0; i < file.message_type_count(); ++i) Message(*file.message_type(i), lines);
  for (int i = 0; i < file.enum_type_count(); ++i) Enum(*file.enum_type(i), lines);
  for (int i = 0; i < file.service_count(); ++i) {
    const auto& s = *file.service(i);
    for (int k = 0; k < s.method_count(); ++k) {
      const auto& m = *s.method(k);
      lines.push_back("rpc " + s.full_name() + "." + m.name() + " " +
                      (m.client_streaming() ? "stream " : "") + m.input_type()->full_name() +
                      " -> " + (m.server_streaming() ? "stream " : "") +
                      m.output_type()->full_name());
    }
  }
  std::sort(lines.begin() + 1, lines.end());
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

}  // namespace tessera::test
