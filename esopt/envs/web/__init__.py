"""Web agents: WebArena-style tasks on four small sites served on loopback (`esopt/Web-v0`).

- `world`: the seeded data of every site, one sqlite template database;
- `app` (with `pages`, `shop`, `forum`, `wiki` and the Jinja2 `templates/`): the Starlette app; `server`: its
  child process, shared by the envs of a process, gone when the last env closes or the parent dies;
- `axtree`, `browser`, `actions`: the text browser (BrowserGym's flattened accessibility tree and action calls);
- `tasks` (with `tasks_shop`, `tasks_forum`, `tasks_wiki`, loaded by `catalog`), `evaluators`, `oracle`: task
  templates in WebArena's JSON schema, their evaluators and scripted solutions;
- `env`: the Gymnasium env.
"""
