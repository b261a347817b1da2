// The E2B JS SDK's Template builder against `siesta serve`: build a
// template with COPY, RUN, ENV, WORKDIR and a start command, create a
// sandbox from its name, check what the steps did, then clean up.
// Run by tests/e2b/test_js_sdk.py with E2B_API_URL, E2B_SANDBOX_URL and
// E2B_API_KEY pointing at the server; argv[2] is the build context, argv[3]
// the template name. Exits non-zero with a message on any mismatch.
import { Sandbox, Template, waitForPort } from 'e2b'

const [context, name] = process.argv.slice(2)
const failures = []
const expect = (what, got, want) => {
  if (got !== want) failures.push(`${what}: got ${JSON.stringify(got)}, want ${JSON.stringify(want)}`)
}

const template = Template({ fileContextPath: context })
  .fromTemplate('base')
  .setEnvs({ JS_VAR: 'from-js' })
  .copy('note.txt', '/opt/js/note.txt', { user: 'user' })
  .setWorkdir('/opt/js')
  .runCmd('echo built-by-js > built.txt', { user: 'root' })
  .setStartCmd('python3 -m http.server 8111 --bind 127.0.0.1', waitForPort(8111))

const logs = []
await Template.build(template, name, { onBuildLogs: (entry) => logs.push(entry.message) })
const sbx = await Sandbox.create(name)
try {
  const run = async (cmd) => (await sbx.commands.run(cmd)).stdout.trim()
  expect('COPY', await sbx.files.read('/opt/js/note.txt'), 'note from the JS SDK\n')
  expect('RUN', await run('cat /opt/js/built.txt'), 'built-by-js')
  expect('ENV', await run('echo $JS_VAR'), 'from-js')
  expect('WORKDIR', await run('pwd'), '/opt/js')
  expect('start command', await run("curl -s -o /dev/null -w '%{http_code}' localhost:8111"), '200')
} finally {
  await sbx.kill()
  await fetch(`${process.env.E2B_API_URL}/templates/${name}`, {
    method: 'DELETE',
    headers: { 'X-API-KEY': process.env.E2B_API_KEY },
  })
}
if (failures.length) {
  console.error(failures.join('\n'))
  process.exit(1)
}
console.log(JSON.stringify({ template: name, sandbox: sbx.sandboxId, logLines: logs.length }))
