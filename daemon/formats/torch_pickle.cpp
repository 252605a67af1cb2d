// parse_pt_pickle (see torch_pickle.hpp). Values live in flat tables, containers hold indices:
// nothing is recursive, so no depth of input reaches the stack; nesting is bounded all the same
// (kPtMaxDepth), for what later walks a value. A container becomes immutable once it is placed in
// another (no pickle writer changes one after that), which keeps the values a tree of bounded
// depth: no cycle can be built.
#include "daemon/formats/torch_pickle.hpp"

#include <cstring>
#include <map>
#include <unordered_map>

#include "common/errors.hpp"
#include "common/text.hpp"

namespace thetad::daemon {
namespace {

enum class Kind : uint8_t { none, boolean, integer, floating, string, tuple, list, dict, global, storage, tensor };
enum class Fn : uint8_t { ordered_dict, rebuild_tensor, rebuild_parameter, restore_type_tag, storage_type };

struct Node {
  Kind kind = Kind::none;
  bool frozen = false;   // placed in a container: no longer changed
  bool ordered = false;  // a dict made by OrderedDict(): BUILD may give it its _metadata
  uint16_t depth = 0;    // 0 for a scalar; a container's: 1 + its deepest item's (1 when empty)
  uint8_t fn = 0, dtype = 0;
  int64_t v = 0;  // integer, boolean; index into strings (string), lists (containers), storages, views
};

struct DtypeName {
  const char* storage;
  PtDtype dtype;
};
constexpr DtypeName kStorages[] = {
    {"FloatStorage", PtDtype::f32}, {"DoubleStorage", PtDtype::f64}, {"HalfStorage", PtDtype::f16},
    {"BFloat16Storage", PtDtype::bf16}, {"LongStorage", PtDtype::i64}, {"IntStorage", PtDtype::i32},
    {"ShortStorage", PtDtype::i16}, {"CharStorage", PtDtype::i8}, {"ByteStorage", PtDtype::u8},
    {"BoolStorage", PtDtype::boolean}};

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::none: return "None";
    case Kind::boolean: return "a boolean";
    case Kind::integer: return "an integer";
    case Kind::floating: return "a float";
    case Kind::string: return "a string";
    case Kind::tuple: return "a tuple";
    case Kind::list: return "a list";
    case Kind::dict: return "a dict";
    case Kind::global: return "a global";
    case Kind::storage: return "a storage";
    case Kind::tensor: return "a tensor";
  }
  return "a value";
}

class Machine {
 public:
  Machine(const char* data, size_t size, const std::string& file)
      : p_(reinterpret_cast<const unsigned char*>(data)), n_(size), file_(file) {}

  PtPickle run() {
    if (byte() != 0x80 || byte() != 2) fail("not pickle protocol 2 (what torch.save writes)");
    while (true) {
      op_at_ = at_;
      const unsigned char op = byte();
      if (op == '.') break;
      step(op);
    }
    if (stack_.size() != 1) fail(std::to_string(stack_.size()) + " values left where the pickle ends, not one");
    return result(stack_[0]);
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw ConfigError(file_ + ": data.pkl, byte " + std::to_string(op_at_) + ": " + what);
  }
  uint64_t le(unsigned width) {
    if (width > n_ - at_) fail("the pickle ends inside an opcode's argument");
    uint64_t v = 0;
    for (unsigned i = width; i-- > 0;) v = (v << 8) | p_[at_ + i];
    at_ += width;
    return v;
  }
  unsigned char byte() { return static_cast<unsigned char>(le(1)); }
  std::string bytes(uint64_t len) {
    if (len > n_ - at_) fail("a string runs past the end of the pickle");
    std::string s(reinterpret_cast<const char*>(p_ + at_), len);
    at_ += len;
    return s;
  }
  // A GLOBAL's line, without its newline.
  std::string line() {
    const auto* nl = static_cast<const unsigned char*>(std::memchr(p_ + at_, '\n', n_ - at_));
    if (!nl) fail("a global's name runs past the end of the pickle");
    std::string s = bytes(static_cast<uint64_t>(nl - (p_ + at_)));
    ++at_;
    return s;
  }

  uint32_t add(Node node) {
    if (nodes_.size() >= kPtMaxValues) fail("more than " + std::to_string(kPtMaxValues) + " values");
    nodes_.push_back(node);
    return static_cast<uint32_t>(nodes_.size() - 1);
  }
  uint32_t scalar(Kind k, int64_t v = 0) {
    Node node;
    node.kind = k;
    node.v = v;
    return add(node);
  }
  uint32_t container(Kind k) {
    Node node;
    node.kind = k;
    node.depth = 1;  // a container is a level, empty or not
    node.v = static_cast<int64_t>(lists_.size());
    lists_.emplace_back();
    return add(node);
  }
  std::vector<uint32_t>& items(uint32_t c) { return lists_[static_cast<size_t>(nodes_[c].v)]; }
  // `child` into container `c` (a tuple being built, or a list or dict not yet placed elsewhere).
  void place(uint32_t c, uint32_t child) {
    if (child == c) fail(std::string(kind_name(nodes_[c].kind)) + " placed in itself");
    nodes_[child].frozen = true;
    const auto depth = static_cast<size_t>(nodes_[child].depth) + 1;
    if (depth > kPtMaxDepth) fail("values nested deeper than " + std::to_string(kPtMaxDepth) + " levels");
    if (depth > nodes_[c].depth) nodes_[c].depth = static_cast<uint16_t>(depth);
    items(c).push_back(child);
  }

  void push(uint32_t v) { stack_.push_back(v); }
  uint32_t pop(const char* what) {
    if (stack_.empty() || (!marks_.empty() && marks_.back() >= stack_.size()))
      fail(std::string(what) + " finds no value on the stack");
    const uint32_t v = stack_.back();
    stack_.pop_back();
    return v;
  }
  size_t pop_mark(const char* what) {
    if (marks_.empty()) fail(std::string(what) + " without a MARK");
    const size_t start = marks_.back();
    marks_.pop_back();
    return start;
  }
  // The container below the mark that `what` fills (APPENDS, SETITEMS), changeable.
  uint32_t target(size_t start, Kind k, const char* what) {
    if (start == 0 || (!marks_.empty() && marks_.back() >= start)) fail(std::string(what) + " finds no container");
    return changeable(stack_[start - 1], k, what);
  }
  uint32_t changeable(uint32_t c, Kind k, const char* what) {
    if (nodes_[c].kind != k) fail(std::string(what) + " on " + kind_name(nodes_[c].kind));
    if (nodes_[c].frozen) fail(std::string(what) + " changes " + kind_name(k) + " already placed in another value");
    return c;
  }
  void set_items(uint32_t dict, size_t start) {
    if ((stack_.size() - start) % 2 != 0) fail("a dict's items are not key, value pairs");
    for (size_t i = start; i < stack_.size(); i += 2) {
      const Kind k = nodes_[stack_[i]].kind;
      if (k != Kind::string && k != Kind::integer) fail(std::string("a dict key that is ") + kind_name(k));
      place(dict, stack_[i]);
      place(dict, stack_[i + 1]);
    }
    stack_.resize(start);
  }
  uint32_t tuple_of(size_t start) {
    const uint32_t t = container(Kind::tuple);
    for (size_t i = start; i < stack_.size(); ++i) place(t, stack_[i]);
    stack_.resize(start);
    return t;
  }
  uint32_t tuple_top(size_t k, const char* what) {
    if (stack_.size() < k || (!marks_.empty() && marks_.back() > stack_.size() - k))
      fail(std::string(what) + " finds fewer than " + std::to_string(k) + " values");
    return tuple_of(stack_.size() - k);
  }
  uint32_t memo(uint64_t id) {
    const auto it = memo_.find(id);
    if (it == memo_.end()) fail("memo entry " + std::to_string(id) + " was never put");
    return it->second;
  }

  void step(unsigned char op);
  void global();
  void reduce();
  void persistent_id();
  uint32_t rebuild_tensor(const std::vector<uint32_t>& args);
  PtPickle result(uint32_t top);

  const unsigned char* p_;
  size_t n_, at_ = 0, op_at_ = 0;
  const std::string& file_;
  std::vector<Node> nodes_;
  std::vector<std::string> strings_;
  std::vector<std::vector<uint32_t>> lists_;
  std::vector<uint32_t> stack_;
  std::vector<size_t> marks_;
  std::unordered_map<uint64_t, uint32_t> memo_;
  std::map<std::string, uint32_t> storage_of_key_;
  PtPickle out_;
};

void Machine::step(unsigned char op) {
  switch (op) {
    case '(': marks_.push_back(stack_.size()); break;
    case 'N': push(scalar(Kind::none)); break;
    case 0x88: push(scalar(Kind::boolean, 1)); break;
    case 0x89: push(scalar(Kind::boolean, 0)); break;
    case 'K': push(scalar(Kind::integer, static_cast<int64_t>(le(1)))); break;
    case 'M': push(scalar(Kind::integer, static_cast<int64_t>(le(2)))); break;
    case 'J': push(scalar(Kind::integer, static_cast<int32_t>(static_cast<uint32_t>(le(4))))); break;
    case 0x8a: {  // LONG1: n bytes, two's complement, little-endian
      const unsigned len = byte();
      if (len > 8) fail("an integer of " + std::to_string(len) + " bytes, wider than 64 bits");
      uint64_t v = le(len);
      if (len > 0 && len < 8 && (v >> (8 * len - 1)) & 1) v |= ~uint64_t{0} << (8 * len);  // sign-extend
      push(scalar(Kind::integer, static_cast<int64_t>(v)));
      break;
    }
    case 'G': le(8); push(scalar(Kind::floating)); break;  // its value is never used
    case 'X': {
      const uint64_t len = le(4);
      strings_.push_back(bytes(len));
      push(scalar(Kind::string, static_cast<int64_t>(strings_.size() - 1)));
      break;
    }
    case ')': push(container(Kind::tuple)); break;
    case 't': push(tuple_of(pop_mark("TUPLE"))); break;
    case 0x85: push(tuple_top(1, "TUPLE1")); break;
    case 0x86: push(tuple_top(2, "TUPLE2")); break;
    case 0x87: push(tuple_top(3, "TUPLE3")); break;
    case ']': push(container(Kind::list)); break;
    case 'l': {
      const size_t start = pop_mark("LIST");
      const uint32_t list = container(Kind::list);
      for (size_t i = start; i < stack_.size(); ++i) place(list, stack_[i]);
      stack_.resize(start);
      push(list);
      break;
    }
    case 'a': {
      const uint32_t v = pop("APPEND"), list = pop("APPEND");
      place(changeable(list, Kind::list, "APPEND"), v);
      push(list);
      break;
    }
    case 'e': {
      const size_t start = pop_mark("APPENDS");
      const uint32_t list = target(start, Kind::list, "APPENDS");
      for (size_t i = start; i < stack_.size(); ++i) place(list, stack_[i]);
      stack_.resize(start);
      break;
    }
    case '}': push(container(Kind::dict)); break;
    case 'd': {
      const size_t start = pop_mark("DICT");
      const uint32_t dict = container(Kind::dict);
      set_items(dict, start);
      push(dict);
      break;
    }
    case 's': {
      if (stack_.size() < 3 || (!marks_.empty() && marks_.back() > stack_.size() - 3))
        fail("SETITEM finds no dict, key and value on the stack");
      set_items(changeable(stack_[stack_.size() - 3], Kind::dict, "SETITEM"), stack_.size() - 2);
      break;
    }
    case 'u': {
      const size_t start = pop_mark("SETITEMS");
      set_items(target(start, Kind::dict, "SETITEMS"), start);
      break;
    }
    case 'q': case 'r': {
      const uint64_t id = le(op == 'q' ? 1 : 4);
      if (stack_.empty()) fail("BINPUT with an empty stack");
      if (memo_.size() >= kPtMaxValues) fail("more than " + std::to_string(kPtMaxValues) + " memo entries");
      memo_[id] = stack_.back();
      break;
    }
    case 'h': push(memo(le(1))); break;
    case 'j': push(memo(le(4))); break;
    case 'c': global(); break;
    case 'R': reduce(); break;
    case 'b': {  // BUILD: an OrderedDict's state (a state dict's _metadata), not kept
      const uint32_t state = pop("BUILD"), obj = pop("BUILD");
      if (nodes_[state].kind != Kind::dict && nodes_[state].kind != Kind::none) fail("BUILD with a state that is not a dict");
      if (!nodes_[changeable(obj, Kind::dict, "BUILD")].ordered) fail("BUILD on a dict that is not an OrderedDict");
      nodes_[state].frozen = true;
      push(obj);
      break;
    }
    case 'Q': persistent_id(); break;
    default: {
      static const char* hex = "0123456789abcdef";
      fail(std::string("opcode 0x") + hex[op >> 4] + hex[op & 15] +
           " is not one of the pickle a state dict is written with");
    }
  }
}

void Machine::global() {
  const std::string module = line(), name = line();
  Node node;
  node.kind = Kind::global;
  if (module == "collections" && name == "OrderedDict") {
    node.fn = static_cast<uint8_t>(Fn::ordered_dict);
  } else if (module == "torch._utils" && name == "_rebuild_tensor_v2") {
    node.fn = static_cast<uint8_t>(Fn::rebuild_tensor);
  } else if (module == "torch._utils" && (name == "_rebuild_parameter" || name == "_rebuild_parameter_with_state")) {
    node.fn = static_cast<uint8_t>(Fn::rebuild_parameter);
  } else if (module == "torch.jit._pickle" && name == "restore_type_tag") {
    node.fn = static_cast<uint8_t>(Fn::restore_type_tag);
  } else {
    const DtypeName* found = nullptr;
    for (const DtypeName& d : kStorages)
      if (module == "torch" && name == d.storage) found = &d;
    if (!found)
      fail("global '" + printable(module.substr(0, 64)) + "." + printable(name.substr(0, 64)) +
           "' is not one a state dict of tensors uses (thetad reads tensors, never code)");
    node.fn = static_cast<uint8_t>(Fn::storage_type);
    node.dtype = static_cast<uint8_t>(found->dtype);
  }
  push(add(node));
}

void Machine::reduce() {
  const uint32_t args = pop("REDUCE"), callee = pop("REDUCE");
  if (nodes_[args].kind != Kind::tuple) fail("REDUCE with arguments that are not a tuple");
  if (nodes_[callee].kind != Kind::global || nodes_[callee].fn == static_cast<uint8_t>(Fn::storage_type))
    fail(std::string("REDUCE calls ") + kind_name(nodes_[callee].kind));
  nodes_[args].frozen = true;
  const std::vector<uint32_t> a = items(args);
  const auto kind = [&](size_t i) { return nodes_[a[i]].kind; };
  switch (static_cast<Fn>(nodes_[callee].fn)) {
    case Fn::ordered_dict: {
      if (!a.empty()) fail("OrderedDict() with arguments");
      const uint32_t d = container(Kind::dict);
      nodes_[d].ordered = true;
      push(d);
      break;
    }
    case Fn::rebuild_tensor: push(rebuild_tensor(a)); break;
    case Fn::rebuild_parameter:  // (tensor, requires_grad, hooks[, state])
      if ((a.size() != 3 && a.size() != 4) || kind(0) != Kind::tensor)
        fail("_rebuild_parameter takes a tensor, requires_grad, hooks and perhaps a state");
      push(a[0]);
      break;
    case Fn::restore_type_tag:  // (value, type name): the value
      if (a.size() != 2 || kind(1) != Kind::string) fail("restore_type_tag takes a value and a type name");
      push(a[0]);
      break;
    case Fn::storage_type: break;
  }
}

// _rebuild_tensor_v2(storage, offset, sizes, strides, requires_grad, hooks[, metadata]).
uint32_t Machine::rebuild_tensor(const std::vector<uint32_t>& a) {
  const auto is = [&](size_t i, Kind k) { return nodes_[a[i]].kind == k; };
  if ((a.size() != 6 && a.size() != 7) || !is(0, Kind::storage) || !is(1, Kind::integer) || !is(2, Kind::tuple) ||
      !is(3, Kind::tuple) || !is(4, Kind::boolean) || !(is(5, Kind::dict) || is(5, Kind::none)) ||
      (a.size() == 7 && !(is(6, Kind::dict) || is(6, Kind::none))))
    fail("_rebuild_tensor_v2 takes a storage, an offset, sizes, strides, requires_grad and hooks");
  PtView view;
  view.storage = static_cast<uint32_t>(nodes_[a[0]].v);
  view.offset = nodes_[a[1]].v;
  for (const auto& [field, out] : {std::make_pair(a[2], &view.sizes), std::make_pair(a[3], &view.strides)})
    for (uint32_t x : items(field)) {
      if (nodes_[x].kind != Kind::integer) fail("a tensor's sizes and strides must be integers");
      out->push_back(nodes_[x].v);
    }
  if (view.sizes.size() != view.strides.size() || view.sizes.size() > kPtMaxDims)
    fail("a tensor of " + std::to_string(view.sizes.size()) + " sizes and " + std::to_string(view.strides.size()) +
         " strides (at most " + std::to_string(kPtMaxDims) + " dimensions)");
  out_.views.push_back(std::move(view));
  return scalar(Kind::tensor, static_cast<int64_t>(out_.views.size() - 1));
}

// ('storage', torch.<TYPE>Storage, key, location, numel): the storage of record "data/<key>".
void Machine::persistent_id() {
  const uint32_t id = pop("BINPERSID");
  const std::vector<uint32_t>* a = nodes_[id].kind == Kind::tuple ? &items(id) : nullptr;
  const auto is = [&](size_t i, Kind k) { return nodes_[(*a)[i]].kind == k; };
  if (!a || a->size() != 5 || !is(0, Kind::string) || strings_[static_cast<size_t>(nodes_[(*a)[0]].v)] != "storage" ||
      !is(1, Kind::global) || nodes_[(*a)[1]].fn != static_cast<uint8_t>(Fn::storage_type) || !is(2, Kind::string) ||
      !is(3, Kind::string) || !is(4, Kind::integer))
    fail("a persistent id that is not ('storage', torch.<type>Storage, key, location, numel)");
  PtStorage st;
  st.dtype = static_cast<PtDtype>(nodes_[(*a)[1]].dtype);
  st.key = strings_[static_cast<size_t>(nodes_[(*a)[2]].v)];
  const std::string& location = strings_[static_cast<size_t>(nodes_[(*a)[3]].v)];
  st.numel = nodes_[(*a)[4]].v;
  // Saved from a GPU or not, the values are read on the host.
  const bool cuda = location.compare(0, 5, "cuda:") == 0 && location.size() > 5 && location.size() < 9 &&
                    location.find_first_not_of("0123456789", 5) == std::string::npos;
  if (location != "cpu" && location != "cuda" && !cuda)
    fail("storage '" + printable(st.key.substr(0, 64)) + "' is on '" + printable(location.substr(0, 64)) +
         "', not the host or a GPU");
  if (st.numel < 0) fail("storage '" + printable(st.key.substr(0, 64)) + "' of " + std::to_string(st.numel) + " elements");
  const auto [it, fresh] = storage_of_key_.emplace(st.key, static_cast<uint32_t>(out_.storages.size()));
  if (fresh) {
    out_.storages.push_back(st);
  } else {
    const PtStorage& was = out_.storages[it->second];
    if (was.dtype != st.dtype || was.numel != st.numel)
      fail("storage '" + printable(st.key.substr(0, 64)) + "' described twice, differently");
  }
  Node node;
  node.kind = Kind::storage;
  node.v = it->second;
  push(add(node));
}

PtPickle Machine::result(uint32_t top) {
  if (nodes_[top].kind != Kind::dict)
    fail(std::string("the pickle holds ") + kind_name(nodes_[top].kind) + ", not a dict {name: tensor}");
  const std::vector<uint32_t>& kv = items(top);
  std::map<std::pair<bool, std::string>, size_t> where;  // a key given again keeps its place
  for (size_t i = 0; i < kv.size(); i += 2) {
    const Node& k = nodes_[kv[i]];
    const Node& v = nodes_[kv[i + 1]];
    PtItem item;
    item.key_is_string = k.kind == Kind::string;
    item.key = item.key_is_string ? strings_[static_cast<size_t>(k.v)] : std::to_string(k.v);
    item.view = v.kind == Kind::tensor ? v.v : -1;
    item.kind = kind_name(v.kind);
    const auto [it, fresh] = where.emplace(std::make_pair(item.key_is_string, item.key), out_.items.size());
    if (fresh) out_.items.push_back(std::move(item));
    else out_.items[it->second] = std::move(item);
  }
  return std::move(out_);
}

}  // namespace

size_t pt_itemsize(PtDtype t) {
  switch (t) {
    case PtDtype::f64: case PtDtype::i64: return 8;
    case PtDtype::f32: case PtDtype::i32: return 4;
    case PtDtype::f16: case PtDtype::bf16: case PtDtype::i16: return 2;
    default: return 1;
  }
}

const char* pt_dtype_name(PtDtype t) {
  switch (t) {
    case PtDtype::f32: return "float32";
    case PtDtype::f64: return "float64";
    case PtDtype::f16: return "float16";
    case PtDtype::bf16: return "bfloat16";
    case PtDtype::i64: return "int64";
    case PtDtype::i32: return "int32";
    case PtDtype::i16: return "int16";
    case PtDtype::i8: return "int8";
    case PtDtype::u8: return "uint8";
    case PtDtype::boolean: return "bool";
  }
  return "?";
}

PtPickle parse_pt_pickle(const char* data, size_t size, const std::string& file) {
  return Machine(data, size, file).run();
}

}  // namespace thetad::daemon
