// The check runner both client tests use: named async checks, run in order,
// each reported; the process exits non-zero if any failed.
export function checklist() {
  const checks = [];
  return {
    check: (name, body) => checks.push([name, body]),
    async run(client) {
      let failed = 0;
      for (const [name, body] of checks) {
        try {
          await body();
          console.log(`ok    ${name}`);
        } catch (error) {
          failed += 1;
          console.log(`FAIL  ${name}\n      ${error.stack ?? error}`);
        }
      }
      console.log(`${checks.length - failed} of ${checks.length} checks passed (${client})`);
      process.exit(failed ? 1 : 0);
    },
  };
}
