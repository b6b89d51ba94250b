// The console's jobs in a real headless Chromium: a client's backup through the
// server shows live with the progress it reports, then its outcome; a client that
// was killed shows as lost; an admin makes a schedule, changes it, runs it now and
// removes it, and a bad interval is refused in the page. Called by
// crates/cairn-cli/tests/it/server.rs.
//
// env: CONSOLE_URL, ADMIN_TOKEN, SHOT_DIR.
import { alertAfter, drive } from "./drive.mjs";

const url = process.env.CONSOLE_URL;
const shots = process.env.SHOT_DIR;

async function clientRows(page) {
  return page.$$eval("#client-job-rows tr[data-state]", (trs) =>
    trs.map((r) => {
      const o = { host: r.querySelector("th").textContent, state: r.dataset.state };
      for (const c of r.querySelectorAll("td")) if (c.dataset.field) o[c.dataset.field] = c.textContent;
      return o;
    }),
  );
}

async function jobRow(page, name) {
  return page.$eval(`#job-rows tr[data-job="${name}"]`, (r) => {
    const o = {};
    for (const c of r.querySelectorAll("td")) if (c.dataset.field) o[c.dataset.field] = c.textContent;
    return o;
  });
}

async function setField(page, id, value) {
  await page.$eval(id, (e) => (e.value = ""));
  if (value) await page.type(id, value);
}

await drive(async (browser, out) => {
  const page = await browser.newPage();
  await page.setViewport({ width: 1280, height: 900 });
  await page.goto(url, { waitUntil: "load" });
  await page.waitForSelector("#token", { visible: true });
  await page.type("#token", process.env.ADMIN_TOKEN);
  await page.keyboard.press("Enter");
  await page.waitForSelector("#client-job-rows tr");

  // The running backup, live: its progress line changes as it reports.
  await page.waitForFunction(
    () => [...document.querySelectorAll('#client-job-rows tr[data-state="running"] td[data-field="progress"]')]
      .some((td) => td.textContent.includes("/s")),
    { timeout: 60000 },
  );
  out.running = (await clientRows(page)).filter((r) => r.state === "running");
  if (shots) await page.screenshot({ path: `${shots}/console-jobs.png`, fullPage: true });
  out.lost = (await clientRows(page)).filter((r) => r.state === "lost");

  // A schedule: made, shown, changed, run now, removed.
  await setField(page, "#schedule-name", "main-hourly-check");
  await page.select("#schedule-kind", "check");
  await setField(page, "#schedule-every", "5s");
  out.bad_every_alert = await alertAfter(page, () => page.click("#schedule-form button[type=submit]"));
  await setField(page, "#schedule-every", "1h");
  await setField(page, "#schedule-read", "10%");
  out.saved_alert = await alertAfter(page, () => page.click("#schedule-form button[type=submit]"));
  await page.waitForSelector('#job-rows tr[data-job="main-hourly-check"]');
  out.made = await jobRow(page, "main-hourly-check");
  await page.click('button[aria-label="Edit schedule main-hourly-check"]');
  out.edit_form_every = await page.$eval("#schedule-every", (e) => e.value);
  await setField(page, "#schedule-every", "2h");
  await alertAfter(page, () => page.click("#schedule-form button[type=submit]"));
  await page.waitForFunction(
    () => document.querySelector('#job-rows tr[data-job="main-hourly-check"] td[data-field="schedule"]')
      .textContent.includes("2h"),
  );
  out.changed = await jobRow(page, "main-hourly-check");
  await page.click('button[aria-label="Run main-hourly-check now"]');
  await page.waitForFunction(
    () => document.querySelector('#job-rows tr[data-job="main-hourly-check"] td[data-field="outcome"]')
      .textContent !== "",
    { timeout: 60000 },
  );
  out.ran = await jobRow(page, "main-hourly-check");
  if (shots) await page.screenshot({ path: `${shots}/console-schedules.png`, fullPage: true });
  out.removed_alert = await alertAfter(page, () =>
    page.click('button[aria-label="Remove schedule main-hourly-check"]'),
  );
  await page.waitForFunction(() => !document.querySelector('#job-rows tr[data-job="main-hourly-check"]'));

  // A retention schedule made through the API with every rule: edited in the page
  // and saved unchanged, it keeps them all.
  await page.waitForSelector('button[aria-label="Edit schedule main-longterm"]');
  await page.click('button[aria-label="Edit schedule main-longterm"]');
  out.longterm_saved_alert = await alertAfter(page, () => page.click("#schedule-form button[type=submit]"));

  // The backup ends: its row says it stored a snapshot.
  await page.waitForSelector('#client-job-rows tr[data-state="ok"]', { timeout: 120000 });
  out.ended = (await clientRows(page)).filter((r) => r.state === "ok");
});
