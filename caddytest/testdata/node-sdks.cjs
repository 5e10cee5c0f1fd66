// The official Node SDKs as clients of the router's translated answers
// (caddytest/nodesdk_test.go, make agents): each call's result, as the SDK
// parsed it, is printed as one JSON line {"name", "ok", "value" | "error"}.
// The SDKs come from AGENTS_DIR's node_modules (NODE_PATH).
const Anthropic = require("@anthropic-ai/sdk").default;
const OpenAI = require("openai").default;

const base = process.env.ROUTER_URL;
const anthropic = new Anthropic({ baseURL: base, apiKey: "client-key", maxRetries: 0 });
const openai = new OpenAI({ baseURL: base + "/v1", apiKey: "client-key", maxRetries: 0 });

const tools = [{ name: "get_weather", description: "Weather", input_schema: { type: "object", properties: { city: { type: "string" } } } }];
const user = [{ role: "user", content: "Weather in Paris?" }];

const calls = {
  // A Messages client of an OpenAI deployment (translated from Chat).
  "messages.create": () => anthropic.messages.create({ model: process.env.MESSAGES_MODEL, max_tokens: 50, tools, messages: user }),
  "messages.stream": () => anthropic.messages.stream({ model: process.env.MESSAGES_MODEL, max_tokens: 50, tools, messages: user }).finalMessage(),
  // A Responses client of an Anthropic deployment (translated through Chat).
  "responses.create": () => openai.responses.create({ model: process.env.RESPONSES_MODEL, input: "Say hi", instructions: "Be brief.", temperature: 0.2 }),
  "responses.stream": () => openai.responses.stream({ model: process.env.RESPONSES_MODEL, input: "Say hi", instructions: "Be brief." }).finalResponse(),
  // A Chat client of an Anthropic deployment.
  "chat.create": () => openai.chat.completions.create({ model: process.env.RESPONSES_MODEL, messages: user }),
  "chat.stream": () => openai.chat.completions.stream({ model: process.env.RESPONSES_MODEL, messages: user }).finalChatCompletion(),
};

(async () => {
  for (const [name, call] of Object.entries(calls)) {
    try {
      console.log(JSON.stringify({ name, ok: true, value: await call() }));
    } catch (e) {
      console.log(JSON.stringify({ name, ok: false, error: String(e && e.message ? e.message : e) }));
    }
  }
})();
