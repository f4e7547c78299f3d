#include "rendezvous/store/wire_codec.h"

#include <array>
#include <cstdio>
#include <cstring>

namespace ddprun::rdzv {
namespace {

constexpr uint8_t kNone = 0xFF;
constexpr uint8_t kAuthByte = 0xDD;  // ddprun's AUTH, the same in every dialect (store_auth.h)

// Byte of each Op (indexed by Op) per dialect; kNone where the dialect lacks the op.
constexpr std::array<uint8_t, kOpCount> kLegacyBytes = {
    /*Validate*/ kNone, /*Set*/ 0,
    /*CompareSet*/ 1,   /*Get*/ 2,
    /*Add*/ 3,          /*Check*/ 4,
    /*Wait*/ 5,
    /*GetNumKeys*/ 6,   /*WatchKey*/ 7,
    /*DeleteKey*/ 8,    /*Append*/ kNone,
    /*MultiGet*/ kNone,
    /*MultiSet*/ kNone, /*CancelWait*/ kNone,
    /*Ping*/ kNone,     /*QueuePush*/ kNone,
    /*QueuePop*/ kNone,
    /*QueueLen*/ kNone, /*ListKeys*/ kNone,
    /*Auth*/ kAuthByte};
constexpr std::array<uint8_t, kOpCount> kMid2023Bytes = {kNone,
                                                         0,
                                                         1,
                                                         2,
                                                         3,
                                                         4,
                                                         5,
                                                         6,
                                                         /*WatchKey*/ kNone,
                                                         /*DeleteKey*/ 7,
                                                         /*Append*/ 8,
                                                         /*MultiGet*/ 9,
                                                         /*MultiSet*/ 10,
                                                         /*CancelWait*/ 11,
                                                         kNone,
                                                         kNone,
                                                         kNone,
                                                         kNone,
                                                         kNone,
                                                         /*Auth*/ kAuthByte};
constexpr std::array<uint8_t, kOpCount> kModernBytes = {
    /*Validate*/ 0,     1, 2, 3, 4, 5, 6, 7,
    /*WatchKey*/ kNone,
    /*DeleteKey*/ 8,
    /*Append*/ 9,
    /*MultiGet*/ 10,
    /*MultiSet*/ 11,
    /*CancelWait*/ 12,
    /*Ping*/ 13,
    /*QueuePush*/ 14,
    /*QueuePop*/ 15,
    /*QueueLen*/ 16,
    /*ListKeys*/ 17,
    /*Auth*/ kAuthByte};

const std::array<uint8_t, kOpCount>& table(Dialect d) {
  switch (d) {
    case Dialect::kLegacy:
      return kLegacyBytes;
    case Dialect::kMid2023:
      return kMid2023Bytes;
    case Dialect::kModern:
      break;
  }
  return kModernBytes;
}

}  // namespace

std::string_view dialect_name(Dialect d) {
  switch (d) {
    case Dialect::kLegacy:
      return "legacy";
    case Dialect::kMid2023:
      return "mid2023";
    case Dialect::kModern:
      break;
  }
  return "modern";
}

std::optional<Dialect> parse_dialect(std::string_view name) {
  for (Dialect d : {Dialect::kLegacy, Dialect::kMid2023, Dialect::kModern}) {
    if (dialect_name(d) == name) return d;
  }
  return std::nullopt;
}

std::string_view op_name(Op op) {
  static constexpr std::array<std::string_view, kOpCount> kNames = {
      "VALIDATE",   "SET",        "COMPARE_SET", "GET",       "ADD",       "CHECK",     "WAIT",
      "GETNUMKEYS", "WATCH_KEY",  "DELETE_KEY",  "APPEND",    "MULTI_GET", "MULTI_SET", "CANCEL_WAIT",
      "PING",       "QUEUE_PUSH", "QUEUE_POP",   "QUEUE_LEN", "LIST",      "AUTH"};
  return kNames[static_cast<size_t>(op)];
}

std::optional<Op> op_from_byte(Dialect d, uint8_t byte) {
  if (byte == kNone) return std::nullopt;  // kNone marks absent ops in the tables
  const auto& t = table(d);
  for (size_t i = 0; i < t.size(); ++i) {
    if (t[i] == byte) return static_cast<Op>(i);
  }
  return std::nullopt;
}

std::optional<uint8_t> op_to_byte(Dialect d, Op op) {
  uint8_t b = table(d)[static_cast<size_t>(op)];
  if (b == kNone) return std::nullopt;
  return b;
}

// ---- WireReader ------------------------------------------------------------------------------------------

bool WireReader::u8(uint8_t& v) {
  if (remaining() < 1) return false;
  v = in_[pos_++];
  return true;
}

bool WireReader::u32(uint32_t& v) {
  if (remaining() < sizeof v) return false;
  std::memcpy(&v, in_.data() + pos_, sizeof v);
  pos_ += sizeof v;
  return true;
}

bool WireReader::u64(uint64_t& v) {
  if (remaining() < sizeof v) return false;
  std::memcpy(&v, in_.data() + pos_, sizeof v);
  pos_ += sizeof v;
  return true;
}

bool WireReader::peek_u64(uint64_t& v) const {
  if (remaining() < sizeof v) return false;
  std::memcpy(&v, in_.data() + pos_, sizeof v);
  return true;
}

bool WireReader::i64(int64_t& v) {
  uint64_t u = 0;
  if (!u64(u)) return false;
  v = static_cast<int64_t>(u);
  return true;
}

WireReader::BytesStatus WireReader::bytes(std::string& v, size_t max_len) {
  size_t start = pos_;
  uint64_t len = 0;
  if (!u64(len)) return BytesStatus::kShort;
  if (len > max_len) {
    pos_ = start;
    return BytesStatus::kTooLong;
  }
  if (remaining() < len) {
    pos_ = start;
    return BytesStatus::kShort;
  }
  v.assign(reinterpret_cast<const char*>(in_.data() + pos_), len);
  pos_ += len;
  return BytesStatus::kOk;
}

// ---- dialect detection -----------------------------------------------------------------------------------

std::optional<Dialect> detect_dialect(std::span<const uint8_t> first) {
  if (first.empty()) return std::nullopt;
  uint8_t b = first[0];
  if (b == 0) {
    // VALIDATE (modern) and SET (legacy, mid-2023) share byte 0. A legacy SET continues with a u64 key
    // length whose low 4 bytes would have to be the magic: a key over 1 GB, which no client sends.
    if (first.size() < 5) return std::nullopt;
    uint32_t magic = 0;
    std::memcpy(&magic, first.data() + 1, sizeof magic);
    return magic == kValidationMagic ? Dialect::kModern : Dialect::kLegacy;
  }
  if (b >= 9 && b <= 11) return Dialect::kMid2023;
  return Dialect::kLegacy;
}

// ---- RequestParser ---------------------------------------------------------------------------------------

RequestParser::RequestParser(WireLimits limits, std::optional<Dialect> forced)
    : limits_(limits), dialect_(forced) {}

namespace {

// Parses the fields of one request after its command byte. Shared by every dialect: the field layout of
// an op never changed, only its byte did.
class FieldParser {
 public:
  // `skip`: fields already parsed by an earlier call that ran out of bytes (their values are in `out`, the
  // count of a multi-key op in `count`); those calls return at once.
  FieldParser(WireReader& r, const WireLimits& limits, Request& out, ParseResult& result, size_t skip,
              uint64_t& count)
      : r_(r), limits_(limits), out_(out), result_(result), skip_(skip), saved_count_(count) {}

  // Fields completed, the skipped ones included.
  size_t done() const { return done_; }
  // Skips the whole items (of `per_item` fields each) parsed earlier, at once; returns how many.
  uint64_t skip_items(size_t per_item) {
    const size_t items = skip_ / per_item;
    skip_ -= items * per_item;
    done_ += items * per_item;
    return items;
  }

  // Returns false when parsing stopped (need more, or error; result_ says which).
  bool key() { return skipped() || field(out_.keys, limits_.max_key_bytes, "key"); }
  bool value() { return skipped() || field(out_.values, limits_.max_value_bytes, "value"); }
  // AUTH's value: a nonce or a proof, refused past a few KiB before anything is buffered.
  bool auth_value() {
    return skipped() ||
           field(out_.values, std::min(limits_.max_auth_bytes, limits_.max_value_bytes), "AUTH value");
  }
  // `is_signed`: the count is an i64 on the wire (MULTI_SET), shown signed in the error.
  bool count(uint64_t& n, bool is_signed = false) {
    if (skipped()) {
      n = saved_count_;
      return true;
    }
    if (!r_.u64(n)) return need_more();
    saved_count_ = n;
    if (n > limits_.max_keys_per_request) {
      std::string shown = is_signed ? std::to_string(static_cast<int64_t>(n)) : std::to_string(n);
      return error("key count " + shown + " exceeds the limit of " +
                   std::to_string(limits_.max_keys_per_request));
    }
    ++done_;
    return true;
  }
  bool i64(int64_t& v) { return skipped() || (r_.i64(v) ? ++done_ > 0 : need_more()); }
  bool u32(uint32_t& v) { return skipped() || (r_.u32(v) ? ++done_ > 0 : need_more()); }

 private:
  bool skipped() {
    if (skip_ == 0) return false;
    --skip_;
    ++done_;
    return true;
  }
  bool field(std::vector<std::string>& list, size_t max, const char* what) {
    if (!string(list.emplace_back(), max, what)) {
      list.pop_back();  // incomplete: parsed again from its start next time
      return false;
    }
    ++done_;
    return true;
  }
  bool string(std::string& s, size_t max, const char* what) {
    uint64_t len = 0;
    if (!r_.peek_u64(len)) return need_more();
    if (len > max) {
      return error(std::string(what) + " length " + std::to_string(len) + " exceeds the limit of " +
                   std::to_string(max) + " bytes");
    }
    // Refuse a request whose declared sizes add up past the limit before buffering its payload.
    if (r_.position() + sizeof(uint64_t) + len > limits_.max_request_bytes) {
      return error("request larger than the limit of " + std::to_string(limits_.max_request_bytes) +
                   " bytes");
    }
    return r_.bytes(s, max) == WireReader::BytesStatus::kOk || need_more();
  }
  bool need_more() {
    result_.status = ParseStatus::kNeedMore;
    return false;
  }
  bool error(std::string msg) {
    result_.status = ParseStatus::kError;
    result_.error = std::move(msg);
    return false;
  }

  WireReader& r_;
  const WireLimits& limits_;
  Request& out_;
  ParseResult& result_;
  size_t skip_;
  uint64_t& saved_count_;
  size_t done_ = 0;
};

bool parse_fields(Op op, FieldParser& f, Request& out) {
  uint64_t n = 0;
  switch (op) {
    case Op::kValidate:
    case Op::kPing:
      return f.u32(out.number);
    case Op::kAuth:
      return f.u32(out.number) && f.auth_value();
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      return f.key() && f.value();
    case Op::kCompareSet:
      return f.key() && f.value() && f.value();
    case Op::kGet:
    case Op::kDeleteKey:
    case Op::kWatchKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
      return f.key();
    case Op::kAdd:
      return f.key() && f.i64(out.delta);
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      if (!f.count(n)) return false;
      for (uint64_t i = f.skip_items(1); i < n; ++i) {
        if (!f.key()) return false;
      }
      return true;
    case Op::kMultiSet:
      // MULTI_SET's count is an i64 on the wire; a negative one reads as a huge u64 and is refused.
      if (!f.count(n, /*is_signed=*/true)) return false;
      for (uint64_t i = f.skip_items(2); i < n; ++i) {
        if (!f.key() || !f.value()) return false;
      }
      return true;
    case Op::kGetNumKeys:
    case Op::kCancelWait:
    case Op::kListKeys:
      return true;
  }
  return true;
}

}  // namespace

ParseResult RequestParser::parse(std::span<const uint8_t> input, Request& out) {
  ParseResult result;
  if (!dialect_) {
    dialect_ = detect_dialect(input);
    if (!dialect_) return result;  // kNeedMore
  }
  // A request that ran out of bytes last time resumes after its last whole field: a large request that
  // arrives in small pieces costs one pass over its bytes, not one per piece.
  if (input.size() < resume_.needed) return result;  // kNeedMore: nothing new to parse yet
  WireReader r(input);
  uint8_t byte = 0;
  if (!r.u8(byte)) return result;
  auto op = op_from_byte(*dialect_, byte);
  if (!op) {
    result.status = ParseStatus::kError;
    char hex[8];
    std::snprintf(hex, sizeof hex, "0x%02x", byte);
    result.error = "unknown command byte " + std::string(hex) + " for the " +
                   std::string(dialect_name(*dialect_)) + " dialect";
    return result;
  }
  if (resume_.fields > 0) {
    out = std::move(resume_.partial);
    r.skip(resume_.position - 1);
  } else {
    out = Request{};
    out.op = *op;
  }
  result.status = ParseStatus::kDone;
  FieldParser fields(r, limits_, out, result, resume_.fields, resume_.count);
  const bool done = parse_fields(*op, fields, out);
  if (!done && result.status == ParseStatus::kNeedMore) {
    // Keep what is parsed; try again once more bytes came.
    resume_.fields = fields.done();
    resume_.position = r.position();
    resume_.needed = input.size() + 1;
    resume_.partial = std::move(out);
    return result;
  }
  resume_ = Resume{};
  if (!done) return result;  // kError
  if (*op == Op::kValidate && out.number != kValidationMagic) {
    result.status = ParseStatus::kError;
    result.error = "VALIDATE with a wrong magic number";
    return result;
  }
  result.consumed = r.position();
  return result;
}

// ---- client side -----------------------------------------------------------------------------------------

bool encode_request(Dialect d, const Request& req, std::string& out) {
  auto byte = op_to_byte(d, req.op);
  if (!byte) return false;
  WireWriter w(out);
  w.u8(*byte);
  switch (req.op) {
    case Op::kValidate:
    case Op::kPing:
      w.u32(req.number);
      break;
    case Op::kAuth:
      w.u32(req.number);
      w.bytes(req.values.at(0));
      break;
    case Op::kSet:
    case Op::kAppend:
    case Op::kQueuePush:
      w.bytes(req.keys.at(0));
      w.bytes(req.values.at(0));
      break;
    case Op::kCompareSet:
      w.bytes(req.keys.at(0));
      w.bytes(req.values.at(0));
      w.bytes(req.values.at(1));
      break;
    case Op::kGet:
    case Op::kDeleteKey:
    case Op::kWatchKey:
    case Op::kQueuePop:
    case Op::kQueueLen:
      w.bytes(req.keys.at(0));
      break;
    case Op::kAdd:
      w.bytes(req.keys.at(0));
      w.i64(req.delta);
      break;
    case Op::kCheck:
    case Op::kWait:
    case Op::kMultiGet:
      w.u64(req.keys.size());
      for (const auto& k : req.keys) w.bytes(k);
      break;
    case Op::kMultiSet:
      w.i64(static_cast<int64_t>(req.keys.size()));
      for (size_t i = 0; i < req.keys.size(); ++i) {
        w.bytes(req.keys[i]);
        w.bytes(req.values.at(i));
      }
      break;
    case Op::kGetNumKeys:
    case Op::kCancelWait:
    case Op::kListKeys:
      break;
  }
  return true;
}

}  // namespace ddprun::rdzv
