// The new-session dialog: a model from the server's allowed list (GET /endpoints), a
// workspace (a directory under one of the server's --workspace-root directories) and a title.
// The server checks every choice; its refusal is shown in the dialog, which stays open.
import { $, element } from "./dom.js";

export class NewSessionDialog {
  // `api(method, path, body)` calls the server; `opened(view)` gets the created session.
  constructor(api, opened) {
    this.api = api;
    this.opened = opened;
    this.dialog = $("new-dialog");
    $("new-cancel").onclick = () => this.dialog.close();
    $("new-form").onsubmit = (event) => { event.preventDefault(); this.create(); };
    // A refusal is about what was sent: editing puts it away.
    $("new-form").oninput = () => { $("new-error").hidden = true; };
  }

  async open() {
    $("new-error").hidden = true;
    $("new-title").value = "";
    $("new-workspace").value = "";
    const select = $("new-model");
    select.replaceChildren(element("option", { value: "{}" }, "loading…"));
    this.dialog.showModal();
    let list = { endpoints: [] };
    try {
      list = await this.api("GET", "endpoints");
    } catch (error) {
      this.fail(`The server's models could not be read: ${error.message}`);
    }
    const groups = list.endpoints.map((endpoint) => element("optgroup", { label: `${endpoint.name}${endpoint.default ? " (default)" : ""}` },
      ...endpoint.models.map((model, index) => element("option", {
        value: JSON.stringify({ llm: endpoint.name, model }),
        selected: endpoint.default && index === 0 ? "" : null,
      }, model))));
    const fallback = element("option", { value: "{}" }, groups.length ? "the server's default" : "the server's model (it offers no choice)");
    select.replaceChildren(fallback, ...groups);
    $("new-model-note").textContent = groups.length
      ? "Only the models the server's operator allows are offered."
      : "";
  }

  fail(message) {
    const box = $("new-error");
    box.textContent = message;
    box.hidden = false;
  }

  async create() {
    const body = { ...JSON.parse($("new-model").value || "{}") };
    const title = $("new-title").value.trim();
    const workspace = $("new-workspace").value.trim();
    if (title) body.title = title;
    if (workspace) body.workspace = workspace;
    $("new-create").disabled = true;
    try {
      const view = await this.api("POST", "sessions", body);
      this.dialog.close();
      await this.opened(view);
    } catch (error) {
      this.fail(error.message);
    } finally {
      $("new-create").disabled = false;
    }
  }
}
