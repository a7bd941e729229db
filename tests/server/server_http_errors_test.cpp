// Bad input over HTTP, one test each, while another client streams from the
// same server throughout (it must finish untouched); the API key on every
// route; and admission control (429 when the queue is full).
#include <gtest/gtest.h>

#include <future>

#include "http_routes.h"
#include "server_harness.h"

namespace colibri::test {
namespace {

class BadInputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    std::string error;
    server_ = ServerProcess::start({"--grpc-port", "-1", "--max-body-bytes", "65536", "--max-tokens-limit", "4096"}, error);
    if (!server_) start_error_ = error;
  }
  static void TearDownTestSuite() { server_.reset(); }

  // A client streaming 400 tokens starts before each test's bad requests and
  // must end normally after them.
  void SetUp() override {
    ASSERT_NE(server_, nullptr) << start_error_;
    std::promise<void> first_event;
    auto started = first_event.get_future();
    background_ = std::async(std::launch::async, [this, promise = std::move(first_event)]() mutable {
      bool signalled = false;
      return http_stream(port(), "/v1/completions",
                         json{{"prompt", "background"}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true},
                              {"return_token_ids", true}},
                         [&](const json&) {
                           if (!signalled) promise.set_value();
                           signalled = true;
                           return true;
                         });
    });
    ASSERT_EQ(started.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  }
  void TearDown() override {
    if (!background_.valid()) return;
    SseResult stream = background_.get();
    EXPECT_EQ(stream.status, 200);
    EXPECT_TRUE(stream.done);
    std::size_t tokens = 0;
    for (const json& event : stream.events)
      if (event.contains("choices") && !event["choices"].empty()) tokens += event["choices"][0]["token_ids"].size();
    EXPECT_EQ(tokens, 400u) << "the other client's stream was disturbed";
  }

  static int port() { return server_->port(); }

  // Posts `body` and checks a 400 (or `status`) in OpenAI's error shape.
  static json expect_error(const std::string& path, const std::string& body, int status, const std::string& param = "") {
    auto res = http_post(port(), path, body);
    EXPECT_EQ(res.status, status) << body << " -> " << res.body;
    json parsed = res.json_body();
    EXPECT_TRUE(parsed.is_object() && parsed.contains("error")) << res.body;
    if (!parsed.is_object() || !parsed.contains("error")) return {};
    const json& error = parsed["error"];
    EXPECT_TRUE(error["message"].is_string());
    EXPECT_TRUE(error["type"].is_string());
    EXPECT_TRUE(error.contains("param") && error.contains("code"));
    if (!param.empty()) {
      EXPECT_EQ(error["param"], param) << body << " -> " << res.body;
    }
    return error;
  }

  static std::unique_ptr<ServerProcess> server_;
  static std::string start_error_;
  std::future<SseResult> background_;
};
std::unique_ptr<ServerProcess> BadInputTest::server_;
std::string BadInputTest::start_error_;

TEST_F(BadInputTest, MalformedJson) {
  EXPECT_EQ(expect_error("/v1/completions", R"({"prompt": "x",)", 400)["code"], "invalid_json");
  expect_error("/v1/completions", "not json at all", 400);
  expect_error("/v1/completions", "[1, 2, 3]", 400);
  expect_error("/v1/chat/completions", "", 400);
  expect_error("/v1/completions", R"({"prompt": "\ud800"})", 400);  // lone surrogate escape
}

TEST_F(BadInputTest, WrongTypes) {
  expect_error("/v1/completions", R"({"prompt": "x", "max_tokens": "10"})", 400, "max_tokens");
  expect_error("/v1/completions", R"({"prompt": "x", "temperature": "0.7"})", 400, "temperature");
  expect_error("/v1/completions", R"({"prompt": 123})", 400, "prompt");
  expect_error("/v1/completions", R"({"prompt": "x", "stop": 42})", 400, "stop");
  expect_error("/v1/completions", R"({"prompt": "x", "stream": "yes"})", 400, "stream");
  expect_error("/v1/completions", R"({"prompt": ["a", "b"]})", 400, "prompt");
  expect_error("/v1/chat/completions", R"({"messages": "hi"})", 400, "messages");
  expect_error("/v1/chat/completions", R"({"messages": null})", 400, "messages");
  expect_error("/v1/chat/completions", R"({"messages": [123]})", 400, "messages[0]");
  expect_error("/v1/chat/completions", R"({"messages": [{}]})", 400, "messages[0].role");
  expect_error("/v1/chat/completions", R"({"messages": [{"role": 123, "content": "x"}]})", 400, "messages[0].role");
  expect_error("/v1/chat/completions", R"({"messages": [{"role": "user", "content": 5}]})", 400, "messages[0].content");
  expect_error("/v1/chat/completions", R"({"messages": [{"role": "wizard", "content": "x"}]})", 400, "messages[0].role");
  expect_error("/v1/chat/completions", R"({"messages": []})", 400, "messages");
  expect_error("/v1/completions", R"({"prompt": ""})", 400, "prompt");
  expect_error("/tokenize", R"({"prompt": 5})", 400, "prompt");
  expect_error("/detokenize", R"({"tokens": ["a"]})", 400, "tokens");
  expect_error("/v1/route", R"({"n_experts": 4, "top_k": 2, "logits": "x"})", 400, "logits");
}

// RELIABILITY.md 1D, row 55: a token id the model has no row for must be
// refused by name before it reaches the embedding table.
TEST_F(BadInputTest, PromptTokenIdsOutsideTheVocabulary) {
  const int vocab = http_get(port(), "/v1/models").json_body()["data"][0]["vocab"];
  auto error = expect_error("/v1/completions", json{{"prompt", {1, vocab}}}.dump(), 400, "prompt");
  EXPECT_NE(error["message"].get<std::string>().find("prompt[1] = " + std::to_string(vocab)), std::string::npos)
      << error["message"];
  expect_error("/v1/completions", json{{"prompt", {-1}}}.dump(), 400, "prompt");
  expect_error("/v1/completions", json{{"prompt", json::array({json::array({1, vocab + 100})})}}.dump(), 400, "prompt");
  expect_error("/v1/completions", R"({"prompt": [1, 4294967296]})", 400, "prompt");
  expect_error("/v1/completions", R"({"prompt": [1, 2.5]})", 400, "prompt");
  expect_error("/detokenize", json{{"tokens", {1, vocab}}}.dump(), 400, "tokens");
  EXPECT_EQ(http_post(port(), "/v1/completions", json{{"prompt", {1, vocab - 1}}, {"max_tokens", 2}}).status, 200);
}

// RELIABILITY.md 1G, row 86: content the server would have to fetch or
// decode (image_url, input_audio) is refused by name; nothing is fetched.
TEST_F(BadInputTest, NonTextContentPartsAreRefusedByName) {
  auto error = expect_error(
      "/v1/chat/completions",
      R"({"messages": [{"role": "user", "content": [{"type": "text", "text": "see"},
          {"type": "image_url", "image_url": {"url": "http://127.0.0.1:1/x.png"}}]}]})",
      400, "messages[0].content[1]");
  EXPECT_NE(error["message"].get<std::string>().find("only text content"), std::string::npos) << error["message"];
  expect_error("/v1/chat/completions",
               R"({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "AAAA"}}]}]})",
               400, "messages[0].content[0]");
  expect_error("/v1/chat/completions", R"({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]})",
               400, "messages[0].content[0]");
}

TEST_F(BadInputTest, MaxTokensOutOfBounds) {
  expect_error("/v1/completions", R"({"prompt": "x", "max_tokens": 0})", 400, "max_tokens");
  expect_error("/v1/completions", R"({"prompt": "x", "max_tokens": -1})", 400, "max_tokens");
  expect_error("/v1/completions", R"({"prompt": "x", "max_tokens": 1.5})", 400, "max_tokens");
  expect_error("/v1/completions", R"({"prompt": "x", "max_tokens": 1099511627776})", 400, "max_tokens");
  expect_error("/v1/completions", R"({"prompt": "x", "max_tokens": 18446744073709551615})", 400, "max_tokens");
  expect_error("/v1/completions", R"({"prompt": "x", "max_tokens": 5000})", 400, "max_tokens");  // above the limit
  // Fits the limit but not the context with the prompt: both numbers named.
  auto error = expect_error("/v1/completions", R"({"prompt": "x y z", "max_tokens": 4096})", 400, "max_tokens");
  EXPECT_EQ(error["code"], "context_length_exceeded");
  EXPECT_EQ(http_post(port(), "/v1/completions", std::string(R"({"prompt": "x", "max_tokens": null})")).status, 200);
}

TEST_F(BadInputTest, TemperatureNegativeOrNotANumber) {
  expect_error("/v1/completions", R"({"prompt": "x", "temperature": -1})", 400, "temperature");
  expect_error("/v1/completions", R"({"prompt": "x", "temperature": 2.5})", 400, "temperature");
  expect_error("/v1/completions", R"({"prompt": "x", "temperature": "NaN"})", 400, "temperature");
  // JSON has no NaN literal; a number that overflows to infinity is refused by the parser.
  expect_error("/v1/completions", R"({"prompt": "x", "temperature": 1e999})", 400);
  expect_error("/v1/completions", R"({"prompt": "x", "temperature": NaN})", 400);
  expect_error("/v1/completions", R"({"prompt": "x", "top_p": 0})", 400, "top_p");
  expect_error("/v1/completions", R"({"prompt": "x", "min_p": 1.5})", 400, "min_p");
  expect_error("/v1/completions", R"({"prompt": "x", "presence_penalty": 3})", 400, "presence_penalty");
  expect_error("/v1/completions", R"({"prompt": "x", "repetition_penalty": 0})", 400, "repetition_penalty");
  expect_error("/v1/completions", R"({"prompt": "x", "top_k": -2})", 400, "top_k");
  expect_error("/v1/completions", R"({"prompt": "x", "seed": -1})", 400, "seed");
  expect_error("/v1/completions", R"({"prompt": "x", "seed": 18446744073709551616})", 400, "seed");
  expect_error("/v1/completions", R"({"prompt": "x", "top_p": 1.5})", 400, "top_p");
  expect_error("/v1/completions", R"({"prompt": "x", "min_p": -0.1})", 400, "min_p");
  expect_error("/v1/completions", R"({"prompt": "x", "frequency_penalty": -2.5})", 400, "frequency_penalty");
  expect_error("/v1/completions", R"({"prompt": "x", "frequency_penalty": "1"})", 400, "frequency_penalty");
  // The edges of each range are accepted.
  EXPECT_EQ(http_post(port(), "/v1/completions",
                      std::string(R"({"prompt": "x", "max_tokens": 1, "seed": 18446744073709551615, "top_p": 1, )"
                                  R"("min_p": 0, "frequency_penalty": -2, "presence_penalty": 2, "temperature": 2})"))
                .status,
            200);
}

TEST_F(BadInputTest, PromptLongerThanTheContext) {
  std::vector<int> ids(5000, 42);
  auto error = expect_error("/v1/completions", json{{"prompt", ids}}.dump(), 400, "prompt");
  EXPECT_EQ(error["code"], "context_length_exceeded");
  EXPECT_EQ(error["n_prompt_tokens"], 5000);
  EXPECT_EQ(error["n_ctx"], 4096);
  const std::string message = error["message"];
  EXPECT_NE(message.find("5000"), std::string::npos) << message;
  EXPECT_NE(message.find("4096"), std::string::npos) << message;
  // A prompt that fills the context leaves no position for the output.
  auto full = expect_error("/v1/completions", json{{"prompt", std::vector<int>(4096, 42)}}.dump(), 400, "prompt");
  EXPECT_EQ(full["code"], "context_length_exceeded");
  EXPECT_EQ(full["n_prompt_tokens"], 4096);
  std::string text;
  for (int i = 0; i < 6000; ++i) text += " w" + std::to_string(i % 10);
  auto chat = expect_error("/v1/chat/completions",
                           json{{"messages", {{{"role", "user"}, {"content", text}}}}}.dump(), 400, "messages");
  EXPECT_EQ(chat["code"], "context_length_exceeded");
}

TEST_F(BadInputTest, UnknownModel) {
  auto error = expect_error("/v1/completions", R"({"model": "gpt-4", "prompt": "x"})", 404);
  EXPECT_EQ(error["code"], "model_not_found");
  expect_error("/v1/chat/completions", R"({"model": "gpt-4", "messages": [{"role": "user", "content": "x"}]})", 404);
  expect_error("/tokenize", R"({"model": "gpt-4", "prompt": "x"})", 404);
  // One model is served: an empty name means it, as an absent one does.
  EXPECT_EQ(http_post(port(), "/v1/completions", std::string(R"({"model": "", "prompt": "x", "max_tokens": 1})")).status,
            200);
}

// A client's string quoted in an error (a model name, a role, a logit_bias key)
// is cut to 64 bytes, so an error never reflects a large payload.
TEST_F(BadInputTest, ErrorsQuoteAtMost64BytesOfAClientsString) {
  const std::string big(10000, 'm');
  const std::string quoted = std::string(64, 'm') + "...";
  auto message = [](const json& error) { return error["message"].get<std::string>(); };
  auto e = expect_error("/v1/completions", json{{"model", big}, {"prompt", "x"}}.dump(), 404);
  EXPECT_NE(message(e).find(quoted), std::string::npos) << e;
  EXPECT_LT(message(e).size(), 300u);
  e = expect_error("/v1/chat/completions", json{{"messages", {{{"role", big}, {"content", "x"}}}}}.dump(), 400,
                   "messages[0].role");
  EXPECT_NE(message(e).find(quoted), std::string::npos) << e;
  EXPECT_LT(message(e).size(), 300u);
  e = expect_error("/v1/messages",
                   json{{"max_tokens", 4}, {"messages", {{{"role", big}, {"content", "x"}}}}}.dump(), 400,
                   "messages[0].role");
  EXPECT_NE(message(e).find(quoted), std::string::npos) << e;
  EXPECT_LT(message(e).size(), 300u);
  e = expect_error("/v1/completions", json{{"prompt", "x"}, {"logit_bias", {{big, 1}}}}.dump(), 400, "logit_bias");
  EXPECT_NE(message(e).find(quoted), std::string::npos) << e;
  EXPECT_LT(message(e).size(), 300u);
}

TEST_F(BadInputTest, BodyOverTheLimit) {
  const std::string body = R"({"prompt": ")" + std::string(70000, 'a') + R"("})";
  auto error = expect_error("/v1/completions", body, 413);
  EXPECT_NE(error["message"].get<std::string>().find("65536"), std::string::npos);
}

TEST_F(BadInputTest, InvalidUtf8InThePrompt) {
  auto error = expect_error("/v1/completions", "{\"prompt\": \"caf\xC3 \xFF\"}", 400);
  EXPECT_EQ(error["code"], "invalid_utf8");
  EXPECT_NE(error["message"].get<std::string>().find("byte 15"), std::string::npos) << error["message"];
  expect_error("/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"\xED\xA0\x80\"}]}", 400);
}

TEST_F(BadInputTest, UnsupportedOptionsAreRefusedByName) {
  expect_error("/v1/completions", R"({"prompt": "x", "n": 2})", 400, "n");
  expect_error("/v1/completions", R"({"prompt": "x", "n": 0})", 400, "n");
  expect_error("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "tools": [{}]})", 400, "tools");
  expect_error("/v1/completions", R"({"prompt": "x", "stop": ["a", "b", "c", "d", "e"]})", 400, "stop");
  expect_error("/v1/completions", R"({"prompt": "x", "stop": [""]})", 400, "stop");
  expect_error("/v1/completions", R"({"prompt": "x", "stop": 42})", 400, "stop");
  auto long_stop = expect_error("/v1/completions", json{{"prompt", "x"}, {"stop", {std::string(1025, 'a')}}}.dump(),
                                400, "stop");
  EXPECT_NE(long_stop["message"].get<std::string>().find("at most 1024"), std::string::npos) << long_stop;
  EXPECT_EQ(http_post(port(), "/v1/completions",
                      json{{"prompt", "x"}, {"max_tokens", 1}, {"stop", {std::string(1024, 'a')}}}.dump())
                .status,
            200);
  expect_error("/v1/completions", R"({"prompt": "x", "best_of": 2})", 400, "best_of");
  expect_error("/v1/completions", R"({"prompt": "x", "suffix": "y"})", 400, "suffix");
  EXPECT_EQ(http_post(port(), "/v1/completions", std::string(R"({"prompt": "x", "n": 1, "max_tokens": 2, "user": "u"})")).status, 200);
}

TEST_F(BadInputTest, LogprobsOutOfShapeOrRange) {
  auto message = [](const json& error) { return error["message"].get<std::string>(); };
  auto e = expect_error("/v1/completions", R"({"prompt": "x", "logprobs": 21})", 400, "logprobs");
  EXPECT_NE(message(e).find("between 0 and 20"), std::string::npos) << e;
  EXPECT_NE(message(e).find("21"), std::string::npos) << e;
  expect_error("/v1/completions", R"({"prompt": "x", "logprobs": -1})", 400, "logprobs");
  e = expect_error("/v1/completions", R"({"prompt": "x", "logprobs": true})", 400, "logprobs");
  EXPECT_NE(message(e).find("an integer"), std::string::npos) << e;
  e = expect_error("/v1/completions", R"({"prompt": "x", "top_logprobs": 2})", 400, "top_logprobs");
  EXPECT_NE(message(e).find("logprobs: N"), std::string::npos) << e;
  const std::string chat = R"({"messages": [{"role": "user", "content": "x"}], )";
  e = expect_error("/v1/chat/completions", chat + R"("top_logprobs": 2})", 400, "top_logprobs");
  EXPECT_NE(message(e).find("logprobs: true"), std::string::npos) << e;
  expect_error("/v1/chat/completions", chat + R"("logprobs": true, "top_logprobs": 30})", 400, "top_logprobs");
  e = expect_error("/v1/chat/completions", chat + R"("logprobs": 3})", 400, "logprobs");
  EXPECT_NE(message(e).find("true or false"), std::string::npos) << e;
  // Explicit "off" values are accepted.
  EXPECT_EQ(http_post(port(), "/v1/completions", std::string(R"({"prompt": "x", "max_tokens": 1, "logprobs": null})")).status, 200);
  auto off = http_post(port(), "/v1/completions", std::string(R"({"prompt": "x", "max_tokens": 1, "logprobs": false})"));
  EXPECT_EQ(off.status, 200);
  EXPECT_TRUE(off.json_body()["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(http_post(port(), "/v1/chat/completions", chat + R"("max_tokens": 1, "logprobs": false})").status, 200);
}

TEST_F(BadInputTest, EchoOnlyForCompletionsAndMaxTokensZeroOnlyWithIt) {
  auto e = expect_error("/v1/completions", R"({"prompt": "x", "max_tokens": 0})", 400, "max_tokens");
  EXPECT_NE(e["message"].get<std::string>().find("0 only with echo"), std::string::npos) << e;
  expect_error("/v1/completions", R"({"prompt": "x", "max_tokens": -1, "echo": true})", 400, "max_tokens");
  e = expect_error("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}], "echo": true})", 400,
                   "echo");
  EXPECT_NE(e["message"].get<std::string>().find("completions field"), std::string::npos) << e;
  expect_error("/v1/completions", R"({"prompt": [[1, 2], [3]]})", 400, "prompt");
  EXPECT_EQ(http_post(port(), "/v1/completions", std::string(R"({"prompt": "x", "max_tokens": 0, "echo": true})")).status,
            200);
}

TEST_F(BadInputTest, ResponseFormatsOtherThanTextAndJsonObject) {
  auto e = expect_error("/v1/chat/completions",
                        R"({"messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {}}})",
                        400, "response_format");
  EXPECT_NE(e["message"].get<std::string>().find("json_object"), std::string::npos) << e;
  expect_error("/v1/completions", R"({"prompt": "x", "response_format": {"type": "xml"}})", 400, "response_format");
  expect_error("/v1/completions", R"({"prompt": "x", "response_format": "json"})", 400, "response_format");
  EXPECT_EQ(http_post(port(), "/v1/completions",
                      std::string(R"({"prompt": "x", "max_tokens": 2, "response_format": {"type": "text"}})")).status,
            200);
}

TEST_F(BadInputTest, LogitBiasOutOfShapeOrRange) {
  auto message = [](const json& error) { return error["message"].get<std::string>(); };
  auto e = expect_error("/v1/completions", R"({"prompt": "x", "logit_bias": [1, 2]})", 400, "logit_bias");
  EXPECT_NE(message(e).find("must be an object"), std::string::npos) << e;
  e = expect_error("/v1/completions", R"({"prompt": "x", "logit_bias": {"abc": 5}})", 400, "logit_bias");
  EXPECT_NE(message(e).find("'abc'"), std::string::npos) << e;
  e = expect_error("/v1/completions", R"({"prompt": "x", "logit_bias": {"12": "high"}})", 400, "logit_bias");
  EXPECT_NE(message(e).find("must be a number"), std::string::npos) << e;
  e = expect_error("/v1/completions", R"({"prompt": "x", "logit_bias": {"12": 150}})", 400, "logit_bias");
  EXPECT_NE(message(e).find("[-100, 100], got 150"), std::string::npos) << e;
  e = expect_error("/v1/completions", R"({"prompt": "x", "logit_bias": {"99999999": 1}})", 400, "logit_bias");
  EXPECT_NE(message(e).find("token id 99999999 is outside the vocabulary"), std::string::npos) << e;
  expect_error("/v1/chat/completions",
               R"({"messages": [{"role": "user", "content": "x"}], "logit_bias": {"-3": 1}})", 400, "logit_bias");
  // Keys are decimal integers and nothing else; values numbers in [-100, 100].
  for (const char* key : {"1.0", " 1", "", "+1", "0x10", "1e2"}) {
    e = expect_error("/v1/completions", json{{"prompt", "x"}, {"logit_bias", {{key, 1}}}}.dump(), 400, "logit_bias");
    EXPECT_NE(message(e).find("decimal integers"), std::string::npos) << key << ": " << e;
  }
  e = expect_error("/v1/completions", R"({"prompt": "x", "logit_bias": {"12": true}})", 400, "logit_bias");
  EXPECT_NE(message(e).find("got a boolean"), std::string::npos) << e;
  expect_error("/v1/completions", R"({"prompt": "x", "logit_bias": {"12": -1000}})", 400, "logit_bias");
  e = expect_error("/v1/completions", R"({"prompt": "x", "logit_bias": [[12, 1]]})", 400, "logit_bias");
  EXPECT_NE(message(e).find("must be an object"), std::string::npos) << e;
  EXPECT_EQ(http_post(port(), "/v1/completions",
                      std::string(R"({"prompt": "x", "max_tokens": 1, "logit_bias": {"12": -100, "13": 100}})"))
                .status,
            200);
}

TEST(ApiKeyTest, EveryRouteButHealthNeedsTheKey) {
  std::string error;
  auto server = ServerProcess::start({"--grpc-port", "-1"}, error, {"COLIBRI_API_KEY=test-key-123"});
  ASSERT_NE(server, nullptr) << error;
  const int port = server->port();
  // Every route the server has (http_routes(), so a route added
  // later is covered without editing this test) but the public /health, a
  // pattern's capture filled in; and an unknown one.
  std::vector<std::pair<std::string, std::string>> routes = {{"GET", "/no/such/route"}};
  for (const server::HttpRoute& route : server::http_routes()) {
    std::string path = route.pattern;
    if (path == "/health") continue;
    if (const auto capture = path.find("(.+)"); capture != std::string::npos) path.replace(capture, 4, "x");
    ASSERT_EQ(path.find_first_of("()[]*+?\\"), std::string::npos) << "a route pattern this test cannot fill: " << path;
    routes.emplace_back(route.method, path);
  }
  ASSERT_GE(routes.size(), 16u);
  for (const httplib::Headers& headers :
       {httplib::Headers{}, httplib::Headers{{"Authorization", "Bearer wrong-key-123"}},
        httplib::Headers{{"Authorization", "test-key-123"}}, httplib::Headers{{"X-Api-Key", "wrong-key-123"}},
        httplib::Headers{{"Api-Key", "test-key-123"}}}) {
    for (const auto& [method, path] : routes) {
      HttpResult res = method == "GET" ? http_get(port, path, headers) : http_post(port, path, std::string("{}"), headers);
      EXPECT_EQ(res.status, 401) << method << " " << path;
      EXPECT_EQ(res.json_body()["error"]["type"], "authentication_error") << path;
    }
  }
  EXPECT_EQ(http_get(port, "/health").status, 200);
  // Anthropic's clients send the key as x-api-key.
  EXPECT_EQ(http_get(port, "/v1/models", {{"x-api-key", "test-key-123"}}).status, 200);
  // A refused POST's body is not read, so its connection is closed rather
  // than kept: a kept-alive client's next request must not be parsed from it.
  httplib::Client client("127.0.0.1", port);
  client.set_keep_alive(true);
  auto refused = client.Post("/v1/completions", {{"Authorization", "Bearer wrong"}}, R"({"prompt": "a long enough body"})",
                             "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 401);
  auto next = client.Post("/v1/completions", {{"Authorization", "Bearer test-key-123"}},
                          R"({"prompt": "x", "max_tokens": 2})", "application/json");
  ASSERT_TRUE(next);
  EXPECT_EQ(next->status, 200) << next->body;
  const httplib::Headers good = {{"Authorization", "Bearer test-key-123"}};
  EXPECT_EQ(http_get(port, "/v1/models", good).status, 200);
  EXPECT_EQ(http_post(port, "/v1/completions", json{{"prompt", "x"}, {"max_tokens", 2}}, good).status, 200);
  auto config = http_get(port, "/admin/config", good);
  EXPECT_EQ(config.status, 200);
  EXPECT_EQ(config.body.find("test-key-123"), std::string::npos) << "the key must not be shown";
}

// A streaming client holding one session of `port`'s server until release(),
// after which it disconnects at its next event.
class SessionHolder {
 public:
  SessionHolder(int port, int max_tokens) : started_(first_event_.get_future()) {
    stream_ = std::async(std::launch::async, [this, port, max_tokens] {
      return http_stream(port, "/v1/completions",
                         json{{"prompt", "hold"}, {"max_tokens", max_tokens}, {"ignore_eos", true}, {"stream", true}},
                         [this](const json&) {
                           if (!seen_.exchange(true)) first_event_.set_value();
                           return !release_.load();
                         });
    });
  }
  ~SessionHolder() { release(); }
  // Whether its first event came (it holds the session) within `limit`.
  bool holding(std::chrono::seconds limit) { return started_.wait_for(limit) == std::future_status::ready; }
  void release() {
    release_ = true;
    if (stream_.valid()) stream_.get();
  }

 private:
  std::promise<void> first_event_;
  std::future<void> started_;
  std::atomic<bool> seen_{false}, release_{false};
  std::future<SseResult> stream_;
};

TEST(AdmissionTest, FullQueueAnswers429WithRetryAfter) {
  std::string error;
  auto server = ServerProcess::start({"--grpc-port", "-1", "--max-sessions", "1", "--max-queue", "1"}, error);
  ASSERT_NE(server, nullptr) << error;
  const int port = server->port();
  // A holds the only session; B waits in the queue; C finds it full.
  SessionHolder a(port, 4000);
  ASSERT_TRUE(a.holding(std::chrono::seconds(10)));
  auto b = std::async(std::launch::async, [&] {
    return http_post(port, "/v1/completions", json{{"prompt", "queued"}, {"max_tokens", 3}});
  });
  for (int i = 0; i < 200 && metric_value(http_get(port, "/metrics").body, "colibri_queue_depth") != 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(metric_value(http_get(port, "/metrics").body, "colibri_queue_depth"), 1);
  auto c = http_post(port, "/v1/completions", json{{"prompt", "rejected"}, {"max_tokens", 3}});
  EXPECT_EQ(c.status, 429) << c.body;
  EXPECT_EQ(c.json_body()["error"]["type"], "rate_limit_error");
  auto retry = c.headers.find("Retry-After");
  ASSERT_NE(retry, c.headers.end());
  EXPECT_GE(std::atoi(retry->second.c_str()), 1);
  a.release();  // B gets the session
  auto b_result = b.get();
  EXPECT_EQ(b_result.status, 200) << b_result.body;
  EXPECT_GE(metric_value(http_get(port, "/metrics").body, "colibri_rejected_requests_total{reason=\"queue_full\"}"), 1);
}

// RELIABILITY.md 1E, row 66: a request that waits longer than
// queue_timeout_ms for a session gets 503 with Retry-After (streaming too: its
// status is only sent once it holds a session), and is counted.
TEST(AdmissionTest, QueueTimeoutAnswers503) {
  std::string error;
  // A holds the only session for seconds (16000 tokens over a growing
  // context); each of the two others gives up after 0.3 s in the queue.
  auto server = ServerProcess::start({"--grpc-port", "-1", "--max-sessions", "1", "--queue-timeout-ms", "300",
                                      "--context-length", "16384", "--max-tokens-limit", "16000"},
                                     error);
  ASSERT_NE(server, nullptr) << error;
  const int port = server->port();
  SessionHolder a(port, 16000);
  ASSERT_TRUE(a.holding(std::chrono::seconds(10)));
  for (const bool stream : {false, true}) {
    SCOPED_TRACE(stream ? "streaming" : "not streaming");
    const auto start = std::chrono::steady_clock::now();
    auto waited = http_post(port, "/v1/completions", json{{"prompt", "waits"}, {"max_tokens", 3}, {"stream", stream}});
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_EQ(waited.status, 503) << waited.body;
    EXPECT_EQ(waited.json_body()["error"]["type"], "unavailable_error") << waited.body;
    EXPECT_NE(waited.headers.find("Retry-After"), waited.headers.end());
    EXPECT_GE(seconds, 0.25);
    EXPECT_LT(seconds, 5.0);
  }
  a.release();
  EXPECT_EQ(metric_value(http_get(port, "/metrics").body, "colibri_rejected_requests_total{reason=\"queue_timeout\"}"), 2);
  EXPECT_EQ(http_post(port, "/v1/completions", json{{"prompt", "after"}, {"max_tokens", 3}}).status, 200);
}

}  // namespace
}  // namespace colibri::test
